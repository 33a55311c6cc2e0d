/*
 * The multi-lock: several plain locks taken together, all or none, under one
 * lease; against other multi-locks with overlapping names and a single lock of
 * one of them.
 *
 * Mirrors, step by step (each step below names its source):
 *   asynclock/_multi.py                 MultiLock.__init__ (the names sorted: the order the parts
 *                                       are taken in), _acquire (taken, then every part checked
 *                                       still held: a part lost meanwhile means all again, in
 *                                       order), _take (all at once where the backend AcquiresMany,
 *                                       else, or when that answered Busy, one part at a time,
 *                                       each waiting its turn; on any exception, _give_back of the
 *                                       parts taken), _enter_body (the body runs under every
 *                                       part), MultiLease._part_ended / _end_lost (a part's end
 *                                       loses the whole: the other parts are released),
 *                                       __aexit__ (a lost whole is not released again)
 *   asynclock/_acquire.py               acquire_all (one request, all or none; cut short, every
 *                                       part is given back by its identity), acquire_new (a part:
 *                                       a try, then a wait in the lock's queue, left when the
 *                                       caller gives up, a grant made meanwhile given back)
 *   asynclock/abc.py                    AcquiresMany.try_acquire_many (every part free, or none
 *                                       taken; a lock with waiters queued counts as taken)
 *   asynclock/backends/redis/_scripts/exclusive_acquire_all.lua
 *                                       the same, as one script (memory://: its table, the same)
 *   asynclock/_holdstate.py             _lose -> _cancel_bodies (a part's loss cancels the bodies
 *                                       under it), _watch_end
 *
 * Clients: client 0 takes multi(["a", "b"]), client 1 multi(["b", "a"]) (both are
 * taken as a, then b), client 2 lock("b"), one acquisition each. Each acquire
 * either waits without a limit or may give up at any time it waits (its timeout
 * runs out, or it is cancelled): chosen when it starts.
 *
 * Each part is an ordinary hold of its plain lock. That lock is abstracted here as
 * a FIFO queue at the server whose release (or expiry) grants the lock to the
 * first waiter, and whose waiter sees its grant in a later step; the lock's own
 * model (redis_lock.pml, ...) checks that its recipe keeps that abstraction. A
 * request runs at the server atomically; its answer comes in a later step (the
 * caller may give up before it).
 *
 * A part is lost when its renewals fail: whether they will is chosen when the
 * part is granted (so a multi-lock whose parts are all renewed never has a loss
 * pending). The client loses it first (its trusted deadline passes: the bodies
 * under it are cancelled), the server's key expires in a later step (the lock
 * models check that the deadline comes first). At most LOSSES parts are lost.
 *
 * Bounds: three clients, one acquisition each; at most one part lost. No
 * liveness property: the multi-lock promises no deadlock (checked here: no state
 * where every client waits), and each part is as fair as its lock's recipe.
 */

#define NAMES 2                /* 0: "a", 1: "b" */
#define CLIENTS 3
#define S 2                    /* client 2: lock("b") */
#ifndef LOSSES
#define LOSSES 1
#endif

/* ---- the server: each lock's holder and FIFO queue ---- */
byte lk[NAMES];                /* the client whose hold has it: client + 1 (0: free) */
byte q[NAMES * CLIENTS];       /* lock n's queue: q[n * CLIENTS + i], client + 1, first in line at i = 0 */
byte qn[NAMES];

/* ---- the clients ---- */
bit held[NAMES * CLIENTS];     /* part n of client c taken (held[c * NAMES + n]) */
bit doomed[NAMES * CLIENTS];   /* its renewals will fail */
bit lost[NAMES * CLIENTS];     /* lost (its trusted deadline passed) */
bit inb[CLIENTS];              /* inside its body */
bit lease[CLIENTS];            /* the MultiLease exists (watching its parts) */
bit leaselost[CLIENTS];        /* ... and was lost */
bit patient[CLIENTS];          /* waits without a limit */
byte losses;

hidden byte s_i, s_j, s_n;

#define P(c, n) ((c) * NAMES + (n))
#define wants(c, n) ((c) != S || (n) == 1)

/* property: whoever is inside its body has every part at the server (so at most
   one client is inside a body over each name, single locks included) */
inline check() {
    s_i = 0;
    do
    :: s_i < CLIENTS ->
        s_j = 0;
        do
        :: s_j < NAMES -> assert(!inb[s_i] || !wants(s_i, s_j) || lk[s_j] == s_i + 1); s_j++
        :: else -> break
        od;
        s_i++
    :: else -> break
    od
}

/* the lock's release (or expiry): granted to its first waiter, else free */
inline hand(n) {
    if
    :: qn[n] > 0 ->
        lk[n] = q[n * CLIENTS];
        s_i = 0;
        do
        :: s_i + 1 < qn[n] -> q[n * CLIENTS + s_i] = q[n * CLIENTS + s_i + 1]; s_i++
        :: else -> break
        od;
        qn[n]--; q[n * CLIENTS + qn[n]] = 0
    :: else -> lk[n] = 0
    fi
}

/* a release by the hold's identity: only if that hold has the lock */
inline release(c, n) {
    if :: lk[n] == c + 1 -> hand(n) :: else -> skip fi
}

/* acquire_new's try: taken if free with nobody queued, else in the queue */
inline try_take(c, n) {
    if
    :: lk[n] == 0 && qn[n] == 0 -> lk[n] = c + 1
    :: else -> q[n * CLIENTS + qn[n]] = c + 1; qn[n]++
    fi
}

/* acquire_new gives up waiting: out of the queue (a grant made meanwhile is given back) */
inline leave(c, n) {
    s_n = 0;
    s_i = 0;
    do
    :: s_i < qn[n] ->
        if :: q[n * CLIENTS + s_i] == c + 1 -> s_n = 1 :: else -> skip fi;
        if :: s_n && s_i + 1 < qn[n] -> q[n * CLIENTS + s_i] = q[n * CLIENTS + s_i + 1] :: else -> skip fi;
        s_i++
    :: else -> break
    od;
    if :: s_n -> qn[n]--; q[n * CLIENTS + qn[n]] = 0 :: else -> skip fi;
    release(c, n)
}

/* _give_back: every part taken is given up (a part the server already let go is not
   released again: by its identity) */
inline give_back(c) {
#ifndef MUTANT_NO_GIVE_BACK
    s_j = 0;
    do
    :: s_j < NAMES ->
        if :: held[P(c, s_j)] -> held[P(c, s_j)] = 0; release(c, s_j) :: else -> skip fi;
        lost[P(c, s_j)] = 0; doomed[P(c, s_j)] = 0;
        s_j++
    :: else -> break
    od
#else
    skip                                     /* BUG: the parts taken before are kept */
#endif
}

/* property: an acquire that gave up holds no part and waits in no queue */
inline none_left(c) {
    s_j = 0;
    do
    :: s_j < NAMES ->
        assert(lk[s_j] != c + 1);
        s_i = 0;
        do :: s_i < qn[s_j] -> assert(q[s_j * CLIENTS + s_i] != c + 1); s_i++ :: else -> break od;
        s_j++
    :: else -> break
    od
}

/* a part granted: whether its renewals will fail is chosen now */
inline granted(c, n) {
    held[P(c, n)] = 1;
    if :: losses < LOSSES && c != S -> doomed[P(c, n)] = 1 :: skip fi
}

/* the parts in the order they are taken: the names sorted (MultiLock.__init__) */
#ifdef MUTANT_CALLER_ORDER
#define part(c, i) ((c) == 1 -> 1 - (i) : (i))   /* BUG: in the caller's order, b then a for client 1 */
#else
#define part(c, i) (i)
#endif

proctype Multi(byte c) {
    byte i, n;
    bit busy;
    if :: patient[c] = 1 :: patient[c] = 0 fi;
again:
    /* acquire_all: one request for every part (exclusive_acquire_all.lua): all or none */
    atomic {
        busy = 0;
        n = 0;
        do
        :: n < NAMES -> if :: lk[n] != 0 || qn[n] > 0 -> busy = 1 :: else -> skip fi; n++
        :: else -> break
        od;
        if
        :: !busy -> lk[0] = c + 1; lk[1] = c + 1
        :: else -> skip
        fi
    };
    if
    :: !busy -> atomic { granted(c, 0); granted(c, 1) }
    :: !busy && !patient[c] ->               /* cut short before the answer: given back by identity */
        atomic { release(c, 0); release(c, 1); none_left(c) };
        goto finish
    :: busy -> skip                          /* Busy: part by part, in order */
    fi;
    i = 0;
    do
    :: i < NAMES ->
        n = part(c, i);
        if
        :: held[P(c, n)] -> skip
        :: else ->
            atomic { try_take(c, n) };       /* acquire_new: a try, queued if it is taken */
            do
            :: atomic { lk[n] == c + 1 -> granted(c, n) }; break
            :: !patient[c] ->                /* the timeout ran out, or the acquire is cancelled */
                atomic {
                    leave(c, n);             /* acquire_new: out of the queue */
                    give_back(c);            /* _take: _give_back(parts) before raising */
                    none_left(c)
                };
                goto finish
            od
        fi;
        i++
    :: else -> break
    od;
    /* _acquire: every part still held? a part lost meanwhile: all of them again */
    atomic {
#ifndef MUTANT_NO_RECHECK
        if
        :: lost[P(c, 0)] || lost[P(c, 1)] -> give_back(c); goto again
        :: else -> skip
        fi;
#endif
        lease[c] = 1;                        /* MultiLease: watching every part's end */
        inb[c] = 1;                          /* _enter_body: under every part */
        check()
    };
    /* the body ends (or was cancelled by a part's loss) */
    atomic {
        inb[c] = 0;
        if
        :: !leaselost[c] ->                  /* release: every part */
            release(c, 0); release(c, 1);
            held[P(c, 0)] = 0; held[P(c, 1)] = 0
        :: else -> skip                      /* lost: _end_lost released the others already */
        fi;
        lease[c] = 0;
        check()
    };
finish:
    skip
}

/* client 2: lock("b"), an ordinary lock (acquire_new) */
proctype Single() {
    if :: patient[S] = 1 :: patient[S] = 0 fi;
    atomic { try_take(S, 1) };
    do
    :: atomic { lk[1] == S + 1 -> held[P(S, 1)] = 1; inb[S] = 1; check() }; break
    :: !patient[S] -> atomic { leave(S, 1); none_left(S) }; goto finish
    od;
    atomic { inb[S] = 0; release(S, 1); held[P(S, 1)] = 0; check() };
finish:
    skip
}

/* a part of a multi-lock is lost: its trusted deadline passes (HoldState._lose:
   the bodies under it are cancelled; MultiLease._part_ended: the whole is lost,
   the other parts released), then the server's key expires */
inline lose(c, n) {
    losses++;
    lost[P(c, n)] = 1; doomed[P(c, n)] = 0;
#ifdef MUTANT_BODY_UNDER_FIRST_PART
    if :: n == 0 -> inb[c] = 0 :: else -> skip fi   /* BUG: the body runs under the first part only */
#else
    inb[c] = 0;                              /* _cancel_bodies (none while it is being taken) */
#endif
    if
    :: lease[c] && !leaselost[c] ->         /* _end_lost: the other parts are released */
        leaselost[c] = 1;
#ifndef MUTANT_LOSS_KEEPS_REST
        s_j = 0;
        do
        :: s_j < NAMES ->
            if :: s_j != n && held[P(c, s_j)] -> held[P(c, s_j)] = 0; release(c, s_j) :: else -> skip fi;
            s_j++
        :: else -> break
        od
#else
        skip                                 /* BUG: the others are kept */
#endif
    :: else -> skip
    fi
}

/* a doomed part's loss (at most LOSSES in all), and the server's key expiring after it */
#define LOSE(c, n) \
    :: atomic { losses < LOSSES && held[P(c, n)] && doomed[P(c, n)] && !lost[P(c, n)] -> lose(c, n); check() } \
    :: atomic { lost[P(c, n)] && lk[n] == c + 1 -> hand(n); check() }

active proctype Faults() {
end_faults:
    do
    LOSE(0, 0)
    LOSE(0, 1)
    LOSE(1, 0)
    LOSE(1, 1)
    od
}

init {
    atomic { run Multi(0); run Multi(1); run Single() }
}
