/*
 * Redlock: one lock over three independent Redis primaries. What it keeps, and
 * what it does not: a node that restarts empty too soon, a node whose clock jumps.
 *
 * Mirrors, step by step (each step below names its source):
 *   asynclock/backends/redis/redlock.py         try_acquire (every node asked at once; a majority
 *                                               answering yes before sent + ttl - drift; otherwise
 *                                               given back on every node that did not say no),
 *                                               renew (renewed only where a majority renewed), release
 *   asynclock/backends/redis/_scripts/hash_acquire.lua, hash_renew.lua, hash_release.lua
 *                                               each node's lock: owner, PEXPIRE
 *   asynclock/_holdstate.py, _keeper.py         deadline = send time + ttl - drift; the cohort timer
 *
 * Time: timers that run down, in ticks; the ttl is TTL ticks. Each node expires a
 * key TTL ticks after it set or renewed it, by its own clock, which runs at the
 * same rate as the others (CLOCK_JUMP drops that assumption). A client counts a
 * lease from the send time of the requests that proved it, TTL - DRIFT ticks on a
 * clock that may fall DRIFT behind.
 *
 * Each node's script is atomic. The requests of one acquire (or renewal) are sent
 * at once and run in one step; each reaches its node, or does not (a node that is
 * down, or a request that times out, is not run at all: one that times out and
 * runs late only holds a node for a hold that gave up, until it expires). Two
 * clients' requests meet at the nodes in the order of their rounds; with some not
 * reaching, their votes still split. One node may crash: it loses its data
 * and comes back after DOWN ticks, empty (RESTART_AT_ONCE drops the rule of a
 * delay of at least a ttl: it comes back at once). Processes are never paused
 * past their deadline in this model: a paused holder runs on until the
 * cancellation is delivered, which only a fencing token could catch, and Redlock
 * has none.
 *
 * Bounds: two clients, one acquisition each; one node crash; the clock stops when
 * the acquisitions ended. No liveness property: Redlock promises no fairness
 * (waiters race).
 */

#define NODES 3
#define QUORUM 2
#define NONE 0
#ifndef TTL
#define TTL 3
#endif
#define DRIFT 1
#ifndef TRIES
#define TRIES 1                /* client 0's acquire tries: 2 to try again after a failed round */
#endif
#ifndef DOWN
#define DOWN (TTL + 1)         /* a crashed node stays away longer than a ttl */
#endif

/* ---- the nodes ---- */
byte owner[NODES];             /* the hold id that has the node's lock (0: none) */
byte left[NODES];              /* ticks until the node's key expires */
bit down[NODES];
byte downleft[NODES];          /* ticks until the crashed node is back (empty) */
bit crashed;

/* ---- the clients ---- */
bit inb[2];
byte dleft[2];                 /* ticks until its trusted deadline */
bit out[2];                    /* a round of requests (acquire or renew) in flight ... */
byte age[2];                   /* ... sent this many ticks ago */
byte yes[2];                   /* nodes (bits) that said yes */
bit finished[2];

hidden byte s_i, s_k, s_n;

#define BIT(n) (1 << (n))
#define COUNT(m) (((m) & 1) + (((m) >> 1) & 1) + (((m) >> 2) & 1))

/* property: at most one client believes it holds */
inline check() {
    assert(!(inb[0] && inb[1]))
}

/* the deadline of a lease proved by requests sent `ago` ticks ago */
inline trust(c, ago) {
#ifdef MUTANT_VALIDITY_FROM_ANSWER
    s_k = TTL - DRIFT; if :: skip :: s_k = s_k + DRIFT fi;
    dleft[c] = s_k                           /* BUG: counted from the last answer, not the send */
#else
    s_k = TTL - DRIFT; if :: skip :: s_k = s_k + DRIFT fi;
    dleft[c] = (s_k > ago -> s_k - ago : 0)
#endif
}

#ifdef MUTANT_NO_QUORUM
#define ENOUGH(m) (COUNT(m) >= 1)            /* BUG: one node's yes is enough */
#else
#define ENOUGH(m) (COUNT(m) >= QUORUM)
#endif

active proctype Clock() {
    byte n;
end_time:
    do
    :: atomic {
        !(finished[0] && finished[1]) ->
        n = 0;
        do
        :: n < NODES ->
            if :: owner[n] != NONE -> left[n]--; if :: left[n] == 0 -> owner[n] = NONE :: else -> skip fi
               :: else -> skip fi;
            if :: down[n] -> downleft[n]--; if :: downleft[n] == 0 -> down[n] = 0 :: else -> skip fi
               :: else -> skip fi;
            n++
        :: else -> break
        od;
        n = 0;
        do
        :: n < 2 ->
            if :: inb[n] -> dleft[n]--; if :: dleft[n] == 0 -> inb[n] = 0 :: else -> skip fi
               :: else -> skip fi;
            if :: out[n] && age[n] < TTL + DRIFT -> age[n]++ :: else -> skip fi;
            n++
        :: else -> break
        od;
        check()
       }
    /* a node crashes: its data is gone; it is back, empty, DOWN ticks later */
    :: atomic {
        !crashed -> crashed = 1;
        if :: n = 0 :: n = 1 :: n = 2 fi;
        owner[n] = NONE; left[n] = 0;
#ifdef RESTART_AT_ONCE
        skip                                 /* (back at once, empty) */
#else
        down[n] = 1; downleft[n] = DOWN
#endif
       }
#ifdef CLOCK_JUMP
    /* a node's clock jumps forward: its key expires early */
    :: atomic { owner[0] != NONE -> owner[0] = NONE; left[0] = 0; check() }
#endif
    od
}

/* one request of client c's round reaching node n: the acquire (or renew) script */
inline at_node(c, h, renewing) {
    if
    :: down[n] -> skip                       /* no answer (the node timeout) */
    :: !down[n] && !renewing && (owner[n] == NONE || owner[n] == h) ->
        owner[n] = h; left[n] = TTL; yes[c] = yes[c] | BIT(n)   /* hash_acquire.lua */
    :: !down[n] && renewing && owner[n] == h ->
        left[n] = TTL; yes[c] = yes[c] | BIT(n)                 /* hash_renew.lua */
    :: else -> skip                          /* another hold has it: no */
    fi
}

/* a round of requests, one to every node: each reaches its node (the script runs
   there) or does not (the node is down, or the request timed out: it never runs) */
inline round(c, h, renewing) {
    yes[c] = 0; n = 0;
    do
    :: n < NODES -> if :: at_node(c, h, renewing) :: skip fi; n++
    :: else -> break
    od;
    n = 0
}

proctype Client(byte c) {
    byte h, n, tries;
attempt:
    atomic { tries++; h = 2 * c + tries; out[c] = 1; age[c] = 0 };   /* sent to every node at once */
    atomic { round(c, h, 0) };
    atomic {                                  /* a majority, and still within its validity? */
        trust(c, age[c]);
        out[c] = 0; age[c] = 0;
        if
        :: ENOUGH(yes[c]) && dleft[c] > 0 -> inb[c] = 1; yes[c] = 0; check()
        :: else -> dleft[c] = 0               /* no: given back (below) */
        fi
    };
    if
    :: !inb[c] ->
        atomic {                              /* released on every node that did not say no */
            n = 0;
            do
            :: n < NODES -> if :: !down[n] && owner[n] == h -> owner[n] = NONE; left[n] = 0 :: else -> skip fi; n++
            :: else -> break
            od;
            yes[c] = 0; n = 0
        };
        if :: c == 0 && tries < TRIES -> goto attempt :: else -> goto done fi
    :: else -> skip
    fi;
    do                                        /* the body; the keeper renews on every node */
    :: inb[c] && !out[c] -> atomic { out[c] = 1; age[c] = 0 }
    :: atomic { out[c] ->
        round(c, h, 1);
        if                                    /* renewed only where a majority renewed */
#ifdef MUTANT_RENEW_ON_ANY
        :: COUNT(yes[c]) >= 1 && inb[c] -> trust(c, age[c])   /* BUG: one node's renewal is enough */
#else
        :: ENOUGH(yes[c]) && inb[c] -> trust(c, age[c])
#endif
        :: else -> skip
        fi;
        if :: dleft[c] == 0 -> inb[c] = 0 :: else -> skip fi;
        out[c] = 0; age[c] = 0; yes[c] = 0;
        check() }
    :: !out[c] -> break                       /* the body ends, or was cancelled */
    od;
    atomic {
        inb[c] = 0; dleft[c] = 0;
        n = 0;
        do                                    /* released everywhere */
        :: n < NODES -> if :: !down[n] && owner[n] == h -> owner[n] = NONE; left[n] = 0 :: else -> skip fi; n++
        :: else -> break
        od;
        n = 0
    };
done:
    finished[c] = 1
}

init {
    atomic { run Client(0); run Client(1) }
}
