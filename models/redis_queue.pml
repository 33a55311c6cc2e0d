/*
 * The Redis queued resource, as the read-write lock, on one server: the
 * queue_*.lua scripts (which the semaphore shares), the client's side of their
 * queue, and the front's trusted deadline.
 *
 * Mirrors, step by step (each step below names its source):
 *   asynclock/backends/redis/_scripts/queue_prelude.lua   prune(), fits(), grant(), serve()
 *   asynclock/backends/redis/_scripts/queue_acquire.lua   take, re-enter, queue or poll
 *   asynclock/backends/redis/_scripts/queue_release.lua   give a hold up (or leave the queue), serve the queue
 *   asynclock/backends/redis/_scripts/queue_renew.lua     renewal of a live hold only
 *   asynclock/backends/redis/_shared.py                   QueuedResource (modes x, r, s; FIFO phases)
 *   asynclock/backends/redis/_queue.py                    QueueClient.try_acquire / wait_queued, Waiting.queued
 *   asynclock/_acquire.py, asynclock/_holdstate.py,       the first try, the give-back of a cancelled acquire,
 *   asynclock/_keeper.py, asynclock/_timing.py            the trusted deadline and the cohort timer
 *
 * The read-write lock: client 0 reads twice; client 1 writes. Properties:
 * the live holders on the server are one writer or readers only; whoever believes
 * it holds (is inside its body) is a live holder, with its token; tokens strictly
 * increase per grant; a newcomer is never granted ahead of a live queued waiter; a
 * cancelled acquire leaves no grant and no queue entry; no deadlock. (The
 * semaphore is the same scripts with another fits(): not modelled.)
 *
 * Time as in redis_lock.pml: timers that run down, TTL ticks to a ttl; a client's
 * clock may fall DRIFT ticks behind over a lease; scripts are atomic; a request is
 * sent and run in separate steps; a hand-over message arrives within MSG_WINDOW or
 * never. The fence counter is never lost here (its lifetime is long), so a token
 * is the last plus one.
 *
 * Bounds: 2 clients, client 0 with ACQS acquisitions and client 1 with one, one at
 * a time; the clock stops once GRANTS tokens were issued; no client crashes (so
 * every hand-over message has a listener: redis_lock.pml covers the grant taken
 * back). Built with -DLIVENESS: no clock, clients that take and release for ever
 * (client 1 cancels some of its waits).
 */

#define N 2                    /* clients */
#define ACQS 2                 /* client 0's acquisitions: hold ids 1, 2 (client 1's: 3) */
#define HOLDS (N * ACQS)
#define NONE 0
#define MX 1                   /* 'x': exclusive, the write side */
#define MR 2                   /* 'r': shared, the read side */
#define MS 3                   /* 's': one of PERMITS, the semaphore (not used here) */
#define PERMITS 1
#define client_of(h) (((h) - 1) / 2)
#ifndef TTL
#define TTL 3
#endif
#ifndef DRIFT
#define DRIFT 1
#endif
#ifndef GRANTS
#define GRANTS 4
#endif
#ifndef MSG_WINDOW
#define MSG_WINDOW 1
#endif

/* the mode of each hold: client 0 reads twice (holds 1, 2); client 1 writes (hold
   3), and with -DLIVENESS then reads (hold 4), for ever */
#define mode_of(h) ((h) == 3 -> MX : MR)

#ifdef LIVENESS
#define ENTRY_TTL 1
#define HOLD_TTL 1
#define live_hold(h) (hmode[h] != NONE)
#define live_entry(h) (1)
#else
#define ENTRY_TTL TTL
#define HOLD_TTL TTL
#define live_hold(h) (hmode[h] != NONE && hleft[h] > 0)
#define live_entry(h) (wleft[h] > 0)
#endif

/* ---- the server: the holds ZSET and data HASH, the queue LIST, the waiting HASH, the fence ---- */
byte hmode[HOLDS + 1];         /* H + D: a hold's mode (NONE: not a holder) ... */
byte hleft[HOLDS + 1];         /* ... the ticks until its score (expiry) ... */
byte htok[HOLDS + 1];          /* ... and its token */
byte q[HOLDS];                 /* Q: queued hold ids, oldest first */
byte qlen;
bit waiting[HOLDS + 1];        /* W: the hold has an entry ... */
byte wleft[HOLDS + 1];         /* ... alive for this many ticks (its waiter polls) */
byte fence;                    /* F: the last token */
byte grants;

/* ---- each client ---- */
byte hid[N];
byte tok[N];
bit inb[N];
byte dleft[N];
bit out[N];
byte age[N];
bit queued[N];
byte qage[N];
bit pend[HOLDS + 1];
byte fly[N];
byte flytok[N];
byte flyage[N];
byte mbox[N];
byte mtok[N];
#ifdef LIVENESS
bit want[N];
#endif

hidden byte r_tok, r_got, r_new, r_head, s_k, s_h, s_n, s_c;

#ifdef LIVENESS
#define token_next(t) t = 1
#else
#define token_next(t) t = fence + 1; assert(t > fence); fence = t; grants++
#endif

/* queue_prelude.lua: prune(): drop the expired holds */
inline prune() {
#ifndef LIVENESS
    s_h = 1;
    do
    :: s_h <= HOLDS -> if :: hmode[s_h] != NONE && hleft[s_h] == 0 -> hmode[s_h] = NONE; htok[s_h] = 0; r_new++
                          :: else -> skip fi; s_h++
    :: else -> break
    od
#else
    skip
#endif
}

/* the number of holders (ZCARD H, pruned), and whether the first is a reader */
inline holders() {
    s_n = 0; s_h = 1;
    do
    :: s_h <= HOLDS -> if :: hmode[s_h] != NONE -> s_n++ :: else -> skip fi; s_h++
    :: else -> break
    od
}

/* queue_prelude.lua: fits(mode): out s_k */
inline fits(mode) {
    holders();
    if
    :: s_n == 0 -> s_k = 1
    :: s_n > 0 && mode == MX -> s_k = 0
    :: s_n > 0 && mode == MS -> s_k = (s_n < PERMITS)   /* (the semaphore: not modelled) */
    :: s_n > 0 && mode == MR ->        /* the holders are all readers or one writer: look at one */
#ifdef MUTANT_READER_JOINS_ANYBODY
        s_k = 1                        /* BUG: a reader joins whoever holds, a writer too */
#else
        s_h = 1;
        do
        :: hmode[s_h] != NONE -> break
        :: else -> s_h++
        od;
        s_k = (hmode[s_h] == MR)
#endif
    fi
}

/* queue_prelude.lua: grant(hold, mode, ttl) */
inline grant(h, t) {
    token_next(t);
    hmode[h] = mode_of(h); hleft[h] = HOLD_TTL; htok[h] = t
}

inline q_remove(at) {
    s_k = at;
    do
    :: s_k + 1 < qlen -> q[s_k] = q[s_k + 1]; s_k++
    :: else -> break
    od;
    qlen--; q[qlen] = NONE
}

/* queue_prelude.lua: serve(permits): grant from the head while they fit, dropping
   dead entries; out r_head: 0 (nil) the queue is empty now, HOLDS + 1 (true) after
   an exclusive grant, else the live head that does not fit */
inline serve() {
    do
    :: qlen == 0 -> r_head = 0; break
    :: qlen > 0 ->
        s_c = q[0];
        if
        :: !waiting[s_c] || !live_entry(s_c) ->        /* dead: LPOP, HDEL */
            q_remove(0); waiting[s_c] = 0; wleft[s_c] = 0
        :: else ->
            fits(mode_of(s_c));
            if
            :: s_k ->
                q_remove(0); waiting[s_c] = 0; wleft[s_c] = 0;
                grant(s_c, r_tok);
                /* PUBLISH "<hold> <token>" on its client's channel (every client listens) */
                fly[client_of(s_c)] = s_c; flytok[client_of(s_c)] = r_tok; flyage[client_of(s_c)] = 0;
                if
                :: mode_of(s_c) == MX -> r_head = HOLDS + 1; break
                :: else -> skip
                fi
            :: else -> r_head = s_c; break
            fi
        fi
    od
}

/* property: a newcomer's grant finds no live entry queued */
inline fifo(h) {
    s_k = 0;
    do
    :: s_k < qlen -> assert(q[s_k] == h || !waiting[q[s_k]] || !live_entry(q[s_k])); s_k++
    :: else -> break
    od
}

/* ---- queue_acquire.lua with ARGV[5] = 1 (queue); `fresh`: ARGV[8]. Out: r_got, r_tok ---- */
inline acquire_script(h, fresh) {
    r_got = 0; r_new = 0;
    prune();                                 /* (r_new: how many were pruned) */
    holders();
    if
    :: r_new == 0 && mode_of(h) == MX && s_n > 0 ->
        r_head = HOLDS + 1                   /* held, and no hold ended since the last serve */
    :: else -> serve()
    fi;
    r_new = 0;
    if
#ifdef MUTANT_POLL_MISSES_GRANT
    :: false ->                             /* BUG: a poll does not see the grant a hand-over made it */
#else
    :: !fresh && hmode[h] != NONE ->        /* already holds (a retry, a poll after a hand-over) */
#endif
        hleft[h] = HOLD_TTL; r_tok = htok[h]; r_got = 1
    :: else ->
        fits(mode_of(h));
#ifdef MUTANT_NEWCOMER_IGNORES_QUEUE
        if :: s_k ->                         /* BUG: a newcomer that fits takes it, queue or not */
#else
        if :: r_head == 0 && s_k ->
#endif
            grant(h, r_tok); r_got = 1; r_new = 1
        :: else -> skip
        fi
    fi;
    if :: r_new -> fifo(h) :: else -> skip fi;
    if
    :: !r_got ->                             /* queue it, or keep its entry alive */
        if
        :: !fresh && r_head != 0 && waiting[h] -> skip   /* (keeps its place) */
        :: else -> q[qlen] = h; qlen++
        fi;
        waiting[h] = 1; wleft[h] = ENTRY_TTL
    :: else -> skip
    fi
}

/* ---- queue_release.lua. Out: r_got ---- */
inline release_script(h) {
    prune();
    r_got = 0;
    if
    :: hmode[h] != NONE -> hmode[h] = NONE; hleft[h] = 0; htok[h] = 0; r_got = 1  /* ZREM, HDEL */
    :: else ->
        if
        :: waiting[h] ->                     /* HDEL W, LREM Q */
            waiting[h] = 0; wleft[h] = 0;
            s_c = 0;
            do
            :: s_c < qlen && q[s_c] == h -> q_remove(s_c); break
            :: s_c < qlen && q[s_c] != h -> s_c++
            :: s_c >= qlen -> break
            od
        :: else -> skip
        fi
    fi;
    r_new = 0;
    serve();
    r_new = 0
}

/* ---- queue_renew.lua: a live hold only ---- */
inline renew_script(h) {
    if :: live_hold(h) ->
        hleft[h] = HOLD_TTL; r_got = 1
    :: else -> r_got = 0
    fi
}

/* properties: the live holders are one writer or readers only; whoever is inside
   its body is a live holder, with its token */
inline check() {
    s_n = 0; s_k = 0; s_h = 1;
    do
    :: s_h <= HOLDS ->
        if :: live_hold(s_h) -> s_n++; if :: hmode[s_h] == MX -> s_k++ :: else -> skip fi
           :: else -> skip fi;
        s_h++
    :: else -> break
    od;
    assert(s_k == 0 || s_n == 1);
    s_c = 0;
    do
    :: s_c < N -> assert(!inb[s_c] || (live_hold(hid[s_c]) && htok[hid[s_c]] == tok[s_c])); s_c++
    :: else -> break
    od
}

inline trust(c, sent_ago) {
#ifndef LIVENESS
    s_k = TTL - DRIFT;
    if :: skip :: s_k = s_k + DRIFT fi;
    dleft[c] = (s_k > sent_ago -> s_k - sent_ago : 0)
#else
    skip
#endif
}

#define dec(x) if :: x > 0 -> x-- :: else -> skip fi
#define inc(x) if :: x < TTL + DRIFT -> x++ :: else -> skip fi

#ifndef LIVENESS
/* the clock: holds and entries run down (a hold whose score passed is no longer
   live, and is pruned by the next script); a body whose deadline comes is cancelled */
active proctype Clock() {
    byte c;
end_time:
    do
    :: atomic {
        grants < GRANTS ->
        c = 1;
        do
        :: c <= HOLDS -> dec(hleft[c]); dec(wleft[c]); c++
        :: else -> break
        od;
        c = 0;
        do
        :: c < N ->
            if :: inb[c] -> dleft[c]--; if :: dleft[c] == 0 -> inb[c] = 0 :: else -> skip fi
               :: else -> skip fi;
            if :: out[c] -> inc(age[c]) :: else -> skip fi;
            if :: queued[c] -> inc(qage[c]) :: else -> skip fi;
            if
            :: fly[c] != NONE -> flyage[c]++;
                if :: flyage[c] > MSG_WINDOW -> fly[c] = NONE; flytok[c] = 0; flyage[c] = 0 :: else -> skip fi
            :: else -> skip
            fi;
            c++
        :: else -> break
        od;
        check()
       }
    od
}
#endif

/* a cancelled acquire's release by identity: afterwards no grant, no entry */
proctype Cleaner(byte c) {
    byte h;
end_clean:
    do
    :: atomic {
        pend[2 * c + 1] || pend[2 * c + 2];
        if
        :: pend[2 * c + 1] -> h = 2 * c + 1
        :: pend[2 * c + 2] -> h = 2 * c + 2
        fi;
        release_script(h);
        assert(hmode[h] == NONE && !waiting[h]);  /* property: no grant, no entry */
        s_c = 0;
        do
        :: s_c < qlen -> assert(q[s_c] != h); s_c++
        :: else -> break
        od;
        pend[h] = 0; h = 0;
        check()
       }
    od
}

/* pub/sub delivery (see redis_lock.pml) */
#ifdef LIVENESS
#define LOSE(c) :: atomic { fly[c] != NONE -> fly[c] = NONE; flytok[c] = 0 }
#else
#define LOSE(c)
#endif
#define DELIVER(c) \
    :: atomic { fly[c] != NONE -> \
                mbox[c] = fly[c]; mtok[c] = flytok[c]; fly[c] = NONE; flytok[c] = 0; flyage[c] = 0 } \
    LOSE(c)
active proctype Network() {
end_net:
    do
    DELIVER(0) DELIVER(1)
    od
}

inline run_acquire(fresh) {
    atomic {
        acquire_script(h, fresh);
        if
        :: r_got -> t = r_tok
        :: else -> queued[c] = 1; qage[c] = age[c]; out[c] = 0; age[c] = 0;
#ifndef MUTANT_STALE_HANDOVER
            if :: mbox[c] == h -> mbox[c] = NONE; mtok[c] = 0 :: else -> skip fi
#endif
        fi;
        check()
    }
}

#define next_hold(c) (hid[c] == 2 * c + 1 -> 2 * c + 2 : 2 * c + 1)

proctype Client(byte c) {
    byte h, t;
#ifndef LIVENESS
    byte acqs;
#endif
end_idle:
    do
    :: atomic {
#ifdef LIVENESS
        !pend[next_hold(c)] ->
        want[c] = 1;
        h = next_hold(c);
        if :: fly[c] == h -> fly[c] = NONE; flytok[c] = 0 :: else -> skip fi
#else
        acqs < (c == 0 -> ACQS : 1) ->       /* client 0 makes ACQS acquisitions, client 1 one */
        h = 2 * c + 1 + acqs; acqs++;
#endif
        hid[c] = h;
        mbox[c] = NONE; mtok[c] = 0;
        out[c] = 1
       };
        run_acquire(1);
        do
        :: t != 0 -> break
        :: atomic { t == 0 && mbox[c] == h ->
            t = mtok[c]; mbox[c] = NONE; mtok[c] = 0;
            out[c] = 1; age[c] = qage[c];
            break }
        :: atomic { t == 0 && mbox[c] != h ->
            mbox[c] = NONE; mtok[c] = 0;
            out[c] = 1; age[c] = 0 };
            run_acquire(0)
#ifdef LIVENESS
        :: t == 0 && c != 0 -> pend[h] = 1; want[c] = 0; goto next
#else
        :: atomic {
            pend[h] = 1; t = 0;
            queued[c] = 0; qage[c] = 0; out[c] = 0; age[c] = 0; goto next }
#endif
        od;
        atomic {
            tok[c] = t; t = 0;
            trust(c, age[c]);
            out[c] = 0; age[c] = 0; queued[c] = 0; qage[c] = 0;
#ifdef LIVENESS
            want[c] = 0;
#else
            if
            :: dleft[c] == 0 -> pend[h] = 1; tok[c] = 0; goto next
            :: else -> skip
            fi;
#endif
            inb[c] = 1;
            check()
        };
        do
#ifndef LIVENESS
        :: inb[c] && !out[c] -> out[c] = 1
        :: atomic { out[c] ->
                renew_script(h);
                if
                :: r_got && inb[c] -> trust(c, age[c]);
                    if :: dleft[c] == 0 -> inb[c] = 0 :: else -> skip fi
                :: !r_got -> inb[c] = 0; dleft[c] = 0
                :: else -> skip
                fi;
                out[c] = 0; age[c] = 0;
                check()
            }
#endif
        :: !out[c] -> break
        od;
        atomic { inb[c] = 0; dleft[c] = 0 };
        atomic { release_script(h); tok[c] = 0; check() };
next:   skip
    od
}

init {
    atomic { run Client(0); run Client(1); run Cleaner(0); run Cleaner(1) }
}

#ifdef LIVENESS
ltl served { [] (want[0] -> <> inb[0]) }
#endif
