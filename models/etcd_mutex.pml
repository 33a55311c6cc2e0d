/*
 * The etcd lock: etcd's Mutex recipe (create revisions, waiting on the deletion of
 * the key just before one's own), the client's lease, and the turns of one
 * client's tasks at its one key.
 *
 * Mirrors, step by step (each step below names its source):
 *   asynclock/backends/etcd/_recipe.py   mutex(): the key <prefix>/<lease id>; Contender.creating: Txn(If
 *                                        create_revision == 0, Then Put + Get first, Else Get key + Get
 *                                        first); last_before: the blocker, the last key created before ours
 *   asynclock/backends/etcd/_queue.py    Queue._advance (create, check, watch from now, _covers: a write
 *                                        between the check and the watch is read again), Queue._grant,
 *                                        Queue.let_go (delete, then pass the turn on)
 *   asynclock/backends/etcd/_turns.py    Turns: a client's tasks take turns at its key; the next task's
 *                                        turn starts once the key is deleted (pass_on)
 *   asynclock/backends/etcd/_holds.py    Holds.acquired (token = create revision, confirmed_at =
 *                                        lease.confirmed_at), Holds.renew (keep-alive + the held keys
 *                                        read), Holds.lease_gone
 *   asynclock/backends/etcd/_session.py  keepalive: confirmed_at = the send time of an answered keep-alive
 *   asynclock/_holdstate.py, _keeper.py  deadline = confirmed_at + lease_time - drift; the cohort timer
 *
 * Time: timers that run down, in ticks; the lease TTL is LEASE ticks. etcd expires
 * a lease LEASE ticks after the last keep-alive it received, deleting its keys; a
 * client counts a hold's lease from the send time of the keep-alive that proved it,
 * for LEASE - DRIFT ticks on a clock that may fall DRIFT behind.
 *
 * Each etcd operation (a transaction, a delete, an expiry) is atomic and takes
 * the next revision; a watch started "from now" reports the deletions after the
 * revision it was confirmed at. Requests are sent and answered in separate steps.
 *
 * Clients: client 0 has two tasks, a and b, one acquisition each, that take turns
 * at its key; its lease may expire once (then its key is made under a new lease,
 * a new key). Client 1 has one task and a lease that lives throughout. The clock
 * stops when every acquisition ended. Built with -DLIVENESS: no clock; client 0's
 * tasks and client 1 take and release the lock for ever, and client 0's lease may
 * end at any time (a new one follows).
 */

#define NONE 0
#ifndef LEASE
#define LEASE 3
#endif
#define DRIFT 1

/* keys: client 0's key under its first lease (0) and under its second (1),
   client 1's key (2) */
#define KEYS 3
#define KEY1 2

/* ---- the server ---- */
byte rev;                      /* the cluster's revision */
byte krev[KEYS];               /* each key's create revision (0: no such key) */
bit lgone;                     /* client 0's lease expired (its key with it) */
byte lleft;                    /* ticks until etcd expires client 0's lease */
bit expired1;                  /* (the one expiry happened) */
byte watching[KEYS];           /* the key (+1) whose deletion each waiting key's watch reports */
bit fired[KEYS];
byte lasttok;

/* ---- the clients ---- */
byte gen;                      /* client 0's lease: 0, or 1 after its first expired */
bit inb[3];                    /* inside its body: task a (0), task b (1), client 1 (2) */
byte tok[3];
byte dleft;                    /* the deadline of client 0's hold (only one of its tasks holds) */
bit out;                       /* client 0's keep-alive in flight ... */
byte age;                      /* ... sent this many ticks ago */
byte cage;                     /* ticks since the send of client 0's last answered keep-alive */
bit turn;                      /* one of client 0's tasks has its key */
bit deleting;                  /* client 0's delete is in flight */
bit finished[3];
#ifdef LIVENESS
bit want[3];
#endif

hidden byte s_i, s_n, s_b, s_k;

#ifdef LIVENESS
/* (no tokens without a clock: revisions are kept as ranks, so the search stays finite) */
inline renumber() {
    s_k = 1;
    do
    :: s_k > rev -> break
    :: s_k <= rev ->
        s_i = 0; s_n = 0;
        do :: s_i < KEYS -> if :: krev[s_i] == s_k -> s_n = 1 :: else -> skip fi; s_i++ :: else -> break od;
        if
        :: s_n -> s_k++
        :: else ->
            s_i = 0;
            do :: s_i < KEYS -> if :: krev[s_i] > s_k -> krev[s_i]-- :: else -> skip fi; s_i++ :: else -> break od;
            rev--
        fi
    od
}
#define PUT(k) rev++; krev[k] = rev; renumber()
#define WRITE rev++; renumber()
#else
#define PUT(k) rev++; krev[k] = rev
#define WRITE rev++
#endif

/* the last key created before key k (the blocker, _recipe.last_before): s_b (key + 1, 0: none) */
inline blocker(k) {
    s_b = NONE; s_i = 0;
    do
    :: s_i < KEYS ->
        if
        :: krev[s_i] != 0 && krev[s_i] < krev[k] && (s_b == NONE || krev[s_i] > krev[s_b - 1]) -> s_b = s_i + 1
        :: else -> skip
        fi;
        s_i++
    :: else -> break
    od
}

/* etcd deletes key k (a delete, or its lease's expiry): a new revision; watches on it fire */
inline delete_key(k) {
    krev[k] = 0; WRITE;
    s_i = 0;
    do
    :: s_i < KEYS -> if :: watching[s_i] == k + 1 -> fired[s_i] = 1; watching[s_i] = NONE :: else -> skip fi; s_i++
    :: else -> break
    od
}

/* property: at most one believer; it owns the lock (its key is the first by create
   revision) with that revision as its token */
#define KEY_OF(t) (t == 2 -> KEY1 : gen)
inline check() {
    s_n = 0; s_k = 0;
    do
    :: s_k < 3 ->
        if
        :: inb[s_k] ->
            s_n++; assert(s_n == 1);
#ifndef LIVENESS
            assert(krev[KEY_OF(s_k)] == tok[s_k]);
#endif
            blocker(KEY_OF(s_k)); assert(krev[KEY_OF(s_k)] != 0 && s_b == NONE)
        :: else -> skip
        fi;
        s_k++
    :: else -> break
    od
}

/* the deadline of client 0's hold proved by a keep-alive sent `ago` ticks ago */
inline trust(ago) {
#ifdef MUTANT_TRUST_KEEPALIVE_ANSWER
    s_k = LEASE - DRIFT; if :: skip :: s_k = s_k + DRIFT fi;
    dleft = s_k                              /* BUG: counted from the answer, not the send */
#else
    s_k = LEASE - DRIFT; if :: skip :: s_k = s_k + DRIFT fi;
    dleft = (s_k > ago -> s_k - ago : 0)
#endif
}

#define inc(x) if :: x < LEASE + DRIFT -> x++ :: else -> skip fi

#ifndef LIVENESS
active proctype Clock() {
end_time:
    do
    :: atomic {
        !(finished[0] && finished[1] && finished[2]) ->
        if :: lleft > 0 -> lleft-- :: else -> skip fi;
        if :: inb[0] || inb[1] -> dleft--;
              if :: dleft == 0 -> inb[0] = 0; inb[1] = 0 :: else -> skip fi
           :: else -> skip fi;
        if :: out -> inc(age) :: else -> skip fi;
        inc(cage);
        check()
       }
    /* etcd expires client 0's lease LEASE ticks after the last keep-alive it got */
    :: atomic {
        !expired1 && lleft == 0 && !lgone ->
        expired1 = 1; lgone = 1;
        if :: krev[gen] != 0 -> delete_key(gen) :: else -> skip fi;
        check()
       }
    od
}

/* client 0's keep-alives (the session's, and the keeper's renewals: one keep-alive
   for every hold): sent, then answered; an answered one moves confirmed_at to its
   send time and renews the hold that is held; "lease not found" ends the lease */
active proctype KeepAlive() {
end_ka:
    do
    :: atomic { !out && !(finished[0] && finished[1]) -> out = 1; age = 0 }
    :: atomic { out ->
        if
        :: !lgone -> lleft = LEASE;
            if :: age < cage -> cage = age :: else -> skip fi;
            if :: inb[0] || inb[1] -> trust(age); if :: dleft == 0 -> inb[0] = 0; inb[1] = 0 :: else -> skip fi
               :: else -> skip fi
        :: lgone ->                           /* Holds.lease_gone: every hold lost; a new lease */
            inb[0] = 0; inb[1] = 0; dleft = 0;
            if :: krev[gen] == 0 -> gen = 1; lgone = 0; lleft = LEASE; cage = age :: else -> skip fi
        fi;
        out = 0; age = 0;
        check()
       }
    od
}
#endif

/* one task's acquisition of the Mutex (Queue._advance); `t`: the task (0, 1: client
   0's a and b; 2: client 1) */
proctype Task(byte t) {
    byte k, mine, b;
#ifdef LIVENESS
end_idle:
    do
    :: want[t] = 1;
#endif
    if                                        /* Turns.take / wait: client 0's tasks take turns */
    :: t < 2 -> atomic { !turn -> turn = 1 }
    :: t == 2 -> skip
    fi;
create:
    /* Txn(If(create_revision(key) == 0), Then(Put(key, lease), Get first), Else(Get key,
       Get first)): under a live lease (Queue._create waits for one) */
    atomic {
        !(t < 2 && lgone) ->
        k = KEY_OF(t);
        if
        :: krev[k] == 0 -> PUT(k)
        :: else -> skip                       /* the key exists: its revision is taken as ours */
        fi;
        mine = krev[k];
        blocker(k); b = s_b
    };
    do
    :: b == NONE -> break                     /* nothing created before it: holds */
    :: b != NONE ->
        /* a watch from now on the blocker; Queue._covers: if the blocker changed since
           the check, look again (its deletion may be older than the watch) */
        atomic {
            watching[k] = b; fired[k] = 0;
#ifndef MUTANT_WATCH_GAP
            blocker(k);
            if :: s_b != b -> watching[k] = NONE; fired[k] = 1 :: else -> skip fi
#endif
        };
        atomic { fired[k] -> fired[k] = 0; watching[k] = NONE };
        atomic {                              /* the check: our key, and what blocks it now */
            if
            :: krev[k] != mine -> goto create /* our key went (the lease expired): queue again */
            :: else -> blocker(k); b = s_b
            fi
        }
    od;
    /* Queue._grant (held if the lease lives) and Holds.acquired: token = create revision,
       confirmed_at = the lease's confirmation */
    atomic {
        if
        :: t < 2 && (lgone || krev[k] != mine) -> goto create
        :: else -> skip
        fi;
        tok[t] = mine;
#ifndef LIVENESS
        if
        :: t < 2 -> trust(cage);
            if :: dleft == 0 -> tok[t] = 0; goto release :: else -> skip fi   /* too late: given back */
        :: else -> skip
        fi;
        assert(tok[t] > lasttok);             /* property: tokens strictly increase per grant */
        lasttok = tok[t];
#else
        want[t] = 0;
#endif
        inb[t] = 1;
        check()
    };
release:
    /* the body ends, or was cancelled; Queue.let_go: Delete(key) (unconditional), and
       the next task's turn once it is deleted (Turns.pass_on) */
    atomic {
        inb[t] = 0; tok[t] = 0; b = 0; mine = 0;
        if :: t < 2 -> deleting = 1 :: else -> skip fi;
#ifdef MUTANT_TURN_BEFORE_DELETE
        if :: t < 2 -> turn = 0 :: else -> skip fi   /* BUG: the turn passes with the delete sent */
#endif
    };
    atomic {
        if :: krev[k] != 0 -> delete_key(k) :: else -> skip fi;
        if :: t < 2 -> deleting = 0; turn = 0 :: else -> skip fi;
        k = 0;
        check()
    };
#ifdef LIVENESS
    od
#else
    finished[t] = 1
#endif
}

#ifdef LIVENESS
/* client 0's lease may end at any time (no clock: revoked, or expired): its key goes,
   its holds are lost, and the next keep-alive brings a new lease, a new key */
active proctype Lease() {
end_lease:
    do
    :: atomic { !lgone -> lgone = 1; inb[0] = 0; inb[1] = 0;
                if :: krev[gen] != 0 -> delete_key(gen) :: else -> skip fi }
    :: atomic { lgone -> gen = 1 - gen; lgone = 0 }
    od
}
#endif

init {
    atomic { lleft = LEASE; run Task(0); run Task(1); run Task(2) }
}

#ifdef LIVENESS
ltl served { [] (want[2] -> <> inb[2]) }
#endif
