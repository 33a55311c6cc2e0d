/*
 * The Redis plain (and fair) lock on one server: the exclusive_*.lua scripts,
 * the client's side of its queue, and the front's trusted deadline.
 *
 * Mirrors, step by step (each step below names its source):
 *   asynclock/backends/redis/_scripts/exclusive_prelude.lua   token(), hold_x(), serve(), find()
 *   asynclock/backends/redis/_scripts/exclusive_acquire.lua   take, re-enter, serve an expired holder's queue, queue or poll
 *   asynclock/backends/redis/_scripts/exclusive_release.lua   release with hand-over, or leave the queue
 *   asynclock/backends/redis/_scripts/exclusive_renew.lua     renewal by the holder only
 *   asynclock/backends/redis/_queue.py                        QueueClient.try_acquire / wait_queued,
 *                                                             Waiting.queued (queued_at), Ticket, Tickets.handle
 *   asynclock/backends/redis/_pubsub.py                       the pub/sub connection's health check
 *   asynclock/_acquire.py                                     _attempt, _granted, _wait_in_queue (a cancelled try given back)
 *   asynclock/_holdstate.py, asynclock/_timing.py            trusted deadline = send time + ttl - drift(ttl)
 *   asynclock/_keeper.py                                      the cohort timer: a body is cancelled at its deadline
 *
 * Time is counted in ticks, by timers that run down: X's expiry (PXAT), each
 * queue entry's deadline, each client's trusted deadline, and the age of each
 * request in flight. The ttl is TTL ticks. The server's clock is the reference;
 * a client counts its deadline on its own monotonic clock, which may fall up to
 * DRIFT ticks behind over one lease (the documented allowance, ttl * 1 % + 2 ms,
 * is one tick here): a deadline counted from a send ends TTL - DRIFT + [0, DRIFT]
 * ticks after it.
 *
 * Each script runs atomically (Redis runs one at a time). A request is sent and
 * run in separate steps, so the clock may move between them (latency, a paused
 * client); a grant's answer is taken in by a later step. Requests of one client
 * reach the server in the order they were sent. Hand-over messages are published
 * by a script and arrive within MSG_WINDOW ticks or never.
 *
 * Bounds: N clients, client 0 making ACQS acquisitions and the others one, one at
 * a time; CRASHES crashes; the clock stops once GRANTS tokens were issued. Every
 * interleaving within those bounds is explored.
 *
 * Built with -DLIVENESS: no clock (no expiry, no renewal, no crash), clients that
 * take and release the lock for ever, hold ids reused once their clean-up ran.
 */

#ifndef N
#define N 2                    /* clients, each with one acquisition at a time */
#endif
#ifndef ACQS
#define ACQS 2                 /* acquisitions of client 0 (hold ids 1, 2); the others make one */
#endif
#define acqs_of(c) (c == 0 -> ACQS : 1)
#define HOLDS (2 * N)
#define QMAX HOLDS             /* queue entries: at most one per hold */
#define NONE 0
#define client_of(h) (((h) - 1) / 2)
#ifndef TTL
#define TTL 3                  /* ttl, in ticks */
#endif
#ifndef DRIFT
#define DRIFT 1                /* drift allowance: _timing.drift(ttl) */
#endif
#ifndef CRASHES
#define CRASHES 1              /* clients that may crash */
#endif
#ifndef GRANTS
#define GRANTS 4               /* the clock stops once this many tokens were issued */
#endif
#ifndef MSG_WINDOW
#define MSG_WINDOW 1           /* a hand-over message arrives this soon, or never (about ttl/3) */
#endif

#ifdef LIVENESS
#define ENTRY_TTL 1
#define entry_live(k) (1)
#else
#define ENTRY_TTL TTL
#define entry_live(k) (qleft[k] > 0)
#endif

/* ---- the server: X and Q (see _exclusive.py's module docstring) ---- */
byte xhold;                    /* X's holder (hold id); NONE: X free or absent */
byte xtok;                     /* X's token: the holder's, or a free X's last one; 0: X absent */
bit xq;                        /* X's flag: 'q' (1) while somebody may be queued, '-' (0) */
byte xleft;                    /* ticks until a held X expires; a free X keeps its token */
byte q[QMAX];                  /* Q: queued hold ids, oldest first */
byte qleft[QMAX];              /* ticks until each entry's deadline: its waiter keeps it alive by polling */
byte qlen;
byte lasttok;                  /* the last token issued (for the property) */
byte floor;                    /* the server's clock in us: above every token of an earlier tick */
byte grants;                   /* tokens issued: the clock stops after GRANTS */

/* ---- each client ---- */
byte hid[N];                   /* its current hold id */
byte tok[N];                   /* the token of its current hold */
bit inb[N];                    /* inside its body: believes it holds */
byte dleft[N];                 /* ticks until its trusted deadline */
bit out[N];                    /* a request is in flight ... */
byte age[N];                   /* ... sent this many ticks ago */
bit queued[N];                 /* its hold was answered "queued" ... */
byte qage[N];                  /* ... by a request sent this many ticks ago (Waiting.queued_at) */
bit pend[HOLDS + 1];           /* a cancelled hold whose release by identity has not run yet */
byte fly[N];                   /* a hand-over message on its way: "<hold> <token>" */
byte flytok[N];
byte flyage[N];                /* ticks since it was published */
byte mbox[N];                  /* the message arrived: the ticket's token (Ticket.token) */
byte mtok[N];
bit sub[N];                    /* its hand-over channel is subscribed (the client lives) */
bit dead[N];                   /* crashed */
#ifdef LIVENESS
bit want[N];                   /* an acquire is under way */
#endif
byte crashes;

/* scratch values of the scripts (each script runs inside one atomic step) */
hidden byte r_hold, r_tok, r_got, r_new, s_k, s_head, s_c, rl_at;

/* X held by `h` with token `t` for a ttl from now (exclusive_prelude.lua: hold_x) */
inline hold_x(t, flag, h) {
    xtok = t; xq = flag; xhold = h;
#ifndef LIVENESS
    xleft = TTL
#endif
}

/* a new token: one more than `last`, never below the server's clock in us
   (exclusive_prelude.lua: token) */
inline token(last, t) {
#ifdef LIVENESS
    t = 1
#else
    if
    :: last + 1 > floor -> t = last + 1
    :: else ->
#ifdef MUTANT_NO_TIME_FLOOR
        /* BUG: with no last token (X expired) the tokens start again from 1 */
        if :: last == 0 -> t = 1 :: else -> t = last + 1 fi
#else
        t = floor
#endif
    fi;
    assert(t > lasttok);       /* property: tokens strictly increase per grant */
    lasttok = t;
    grants++
#endif
}

/* LPOP, LREM: drop entry `at`, the later ones move up */
inline q_remove(at) {
    s_k = at;
    do
    :: s_k + 1 < qlen -> q[s_k] = q[s_k + 1]; qleft[s_k] = qleft[s_k + 1]; s_k++
    :: else -> break
    od;
    qlen--; q[qlen] = NONE; qleft[qlen] = 0
}

/* the position of `h`'s entry (exclusive_prelude.lua: find); QMAX if not queued */
inline q_find(h, at) {
    at = 0;
    do
    :: at < qlen && q[at] == h -> break
    :: at < qlen && q[at] != h -> at++
    :: at >= qlen -> at = QMAX; break
    od
}

/* exclusive_prelude.lua: serve(last, caller). X goes to the first live entry,
   dropping dead ones; its client is told on its channel (PUBLISH), unless it is
   the caller, which the script answers. A grant whose message reaches nobody is
   taken back (the next is served). Out: r_got (somebody holds now), r_hold;
   r_tok: its token, or the last issued (0: none, X untouched) */
inline serve(last, caller) {
    r_got = 0; r_tok = last;
    do
    :: qlen == 0 -> break
    :: qlen > 0 && !entry_live(0) -> q_remove(0)         /* a dead entry: dropped */
    :: qlen > 0 && entry_live(0) ->
        s_head = q[0];
        q_remove(0);
        token(r_tok, r_tok);
        hold_x(r_tok, 1, s_head);
        s_c = client_of(s_head);
        if
        :: s_head == caller -> r_got = 1; r_hold = s_head; break
        :: s_head != caller && sub[s_c] ->                /* PUBLISH: one subscriber */
            fly[s_c] = s_head; flytok[s_c] = r_tok; flyage[s_c] = 0;
            r_got = 1; r_hold = s_head; break
        :: else -> skip                                   /* reached nobody: the next */
        fi
    od
}

/* property: nobody jumps the queue: a grant to the caller finds no live entry of
   another hold */
inline fifo(h) {
    s_k = 0;
    do
    :: s_k < qlen -> assert(q[s_k] == h || !entry_live(s_k)); s_k++
    :: else -> break
    od
}

/* ---- exclusive_acquire.lua with ARGV[3] = 1 (queue if it cannot be had now).
   `fresh`: ARGV[5], the first request of this hold. Out: r_got and r_tok
   (granted with that token), else queued. ---- */
inline acquire_script(h, fresh) {
    r_got = 0; r_new = 0;                   /* (r_new: the caller took X as a newcomer) */
    if
    :: xtok != 0 && xhold == NONE ->        /* free: nobody is queued */
        token(xtok, r_tok); hold_x(r_tok, 0, h); r_got = 1; r_new = 1
    :: xtok == 0 && qlen == 0 ->           /* never used, expired or lost, and nobody queued */
        token(0, r_tok); hold_x(r_tok, 0, h); r_got = 1; r_new = 1
#ifdef MUTANT_POLL_MISSES_HANDOVER
    :: false ->                             /* BUG: a poll does not see that the lock was handed to it */
#else
    :: xhold != NONE && xhold == h ->       /* a retry, or a poll after a hand-over: still ours */
#endif
        r_tok = xtok; hold_x(xtok, xq, h); r_got = 1
    :: xtok == 0 && qlen > 0 ->             /* the holder expired while others are queued */
#ifdef MUTANT_JUMP_EXPIRED_QUEUE
        /* BUG: the newcomer takes the lock before the queue that waited for it */
        token(0, r_tok); hold_x(r_tok, 1, h); r_got = 1; r_new = 1
#else
        serve(0, h);                        /* the queue goes first */
        if
        :: r_got && r_hold == h -> skip     /* ... and served the caller */
        :: !r_got ->                        /* nobody queued is alive */
            token(r_tok, r_tok); hold_x(r_tok, 0, h); r_got = 1; r_new = 1
        :: r_got && r_hold != h -> r_got = 0 /* another got it (flag q): queue behind */
        fi
#endif
#ifdef MUTANT_POLL_MISSES_HANDOVER
    :: xhold != NONE -> skip
#else
    :: xhold != NONE && xhold != h -> skip  /* held by another */
#endif
    fi;
    if :: r_new -> fifo(h) :: else -> skip fi;
    if
    :: !r_got ->                            /* queue, or keep the entry alive (a poll) */
        if
        :: fresh -> s_k = QMAX
        :: !fresh -> q_find(h, s_k)
        fi;
        if
        :: s_k < QMAX -> qleft[s_k] = ENTRY_TTL                    /* LSET */
        :: else -> q[qlen] = h; qleft[qlen] = ENTRY_TTL; qlen++   /* RPUSH */
        fi;
#ifdef MUTANT_NO_QUEUE_FLAG
        skip                                /* BUG: the holder's release is not told anybody waits */
#else
        xq = 1                              /* the holder's release must hand over now */
#endif
    :: else -> skip
    fi
}

/* ---- exclusive_release.lua: give it up (to the head of the queue), or leave the
   queue. Out: r_got: 1 released, 0 not the holder. ---- */
inline release_script(h) {
#ifdef MUTANT_RELEASE_NO_OWNER_CHECK
    /* BUG: the release frees X whoever holds it */
    if :: xhold != NONE -> xhold = h :: else -> skip fi;
#endif
    if
    :: xhold != NONE && xhold == h ->
        if
        :: xq ->
            serve(xtok, NONE);
            if
            :: !r_got -> xhold = NONE; xq = 0; xtok = r_tok; xleft = 0  /* free, keeping the last token */
            :: else -> skip
            fi
        :: else -> xhold = NONE; xleft = 0      /* free, keeping its token */
        fi;
        r_got = 1
    :: else ->
        q_find(h, rl_at);
        if
        :: rl_at < QMAX ->
            q_remove(rl_at);
            if
            :: xhold == NONE && qlen > 0 ->     /* no live holder while others are queued */
                serve(xtok, NONE);
                if
                :: !r_got && r_tok != 0 -> xhold = NONE; xq = 0; xtok = r_tok; xleft = 0
                :: else -> skip
                fi
            :: else -> skip
            fi
        :: else -> skip
        fi;
        r_got = 0
    fi
}

/* ---- exclusive_renew.lua: the holder only; its expiry reset to a ttl from now ---- */
inline renew_script(h) {
    if
    :: xhold != NONE && xhold == h -> xleft = TTL; r_got = 1
    :: else -> r_got = 0
    fi
}

/* property: whoever is inside its body is the server's holder, with its token
   (so at most one is: X has one holder) */
inline check() {
    s_c = 0;
    do
    :: s_c < N -> assert(!inb[s_c] || (xhold == hid[s_c] && xtok == tok[s_c])); s_c++
    :: else -> break
    od
}

/* the trusted deadline of a hold proved by a request sent `sent_ago` ticks ago
   (HoldState: sent_at + lease_time - drift(ttl)), as the ticks left on the server's
   clock: 0..DRIFT more on a slow client clock. Out: dleft[c] (0: already passed) */
inline trust(c, sent_ago) {
#ifndef LIVENESS
    s_k = TTL - DRIFT;
#ifdef MUTANT_NO_DRIFT_MARGIN
    s_k = TTL;                 /* BUG: the server's ttl, with no allowance for a slow clock */
#endif
    if :: skip :: s_k = s_k + DRIFT fi;
    dleft[c] = (s_k > sent_ago -> s_k - sent_ago : 0)
#else
    skip
#endif
}

#define dec(x) if :: x > 0 -> x-- :: else -> skip fi
#define inc(x) if :: x < TTL + DRIFT -> x++ :: else -> skip fi

#ifndef LIVENESS
/* the clock: a tick on every timer. A held X whose expiry comes is gone (Redis
   expires it by its clock, token and all); a body whose deadline comes is cancelled
   at once (_keeper.py: the cohort timer, a loop callback, loses the lease). */
active proctype Clock() {
    byte c;
end_time:
    do
    :: atomic {
        grants < GRANTS ->
        if
        :: xhold != NONE -> xleft--;
            if :: xleft == 0 -> xhold = NONE; xtok = 0; xq = 0 :: else -> skip fi
        :: else -> skip
        fi;
        c = 0;
        do
        :: c < QMAX -> dec(qleft[c]); c++
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
            :: fly[c] != NONE ->
                flyage[c]++;
#ifndef LATE_MESSAGES                   /* (LATE_MESSAGES: that assumption dropped) */
                if :: flyage[c] > MSG_WINDOW -> fly[c] = NONE; flytok[c] = 0; flyage[c] = 0 :: else -> skip fi
#else
                flyage[c] = 0
#endif
            :: else -> skip
            fi;
            c++
        :: else -> break
        od;
        if :: floor <= lasttok -> floor = lasttok + 1 :: else -> skip fi;
        check()
       }
    od
}
#endif

/* a cancelled acquire's release by identity (_acquire.py: settle(release_by_identity),
   a task of its own), sent after the cancelled request and run whenever: then the
   hold has neither the lock nor a queue entry */
proctype Cleaner(byte c) {
    byte h;
end_clean:
    do
    :: atomic {
        !dead[c] && (pend[2 * c + 1] || pend[2 * c + 2]);
        if
        :: pend[2 * c + 1] -> h = 2 * c + 1
        :: pend[2 * c + 2] -> h = 2 * c + 2
        fi;
        release_script(h);
        assert(xhold != h);        /* property: a cancelled acquire leaves no grant ... */
        q_find(h, rl_at);
        assert(rl_at == QMAX);     /* ... and no queue entry */
        pend[h] = 0; h = 0;
        check()
       }
    od
}

/* pub/sub: a message arrives within MSG_WINDOW of its publication, or never (the
   clock drops it then: the hold's poll finds the grant). The connection is pinged
   once idle for ttl/6 and replaced when the ping is not answered within another
   ttl/6 (_pubsub.py: health_interval), and TCP delivers in order, so a message held
   up longer dies with its connection. */
#ifdef LIVENESS
#define LOSE(c) :: atomic { fly[c] != NONE -> fly[c] = NONE; flytok[c] = 0 }  /* (no clock: lost at once) */
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
#if N > 2
    DELIVER(2)
#endif
    od
}

/* an acquire request of `h` (the first try, or a poll) runs on the server: a grant is
   answered later (t); "queued" is taken in at once (Waiting.queued: queued_at is the
   request's send time) */
inline run_acquire(fresh) {
    atomic {
        acquire_script(h, fresh);
        if
        :: r_got -> t = r_tok
        :: else -> queued[c] = 1; qage[c] = age[c]; out[c] = 0; age[c] = 0;
#ifndef MUTANT_STALE_HANDOVER
            /* _queue.QueueClient.wait_queued: a message that arrived while this poll
               was out may be older than the poll's answer: it only wakes the hold,
               whose next poll confirms it */
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
    byte acqs;                              /* acquisitions started */
#endif
    sub[c] = 1;
end_idle:                                   /* (idle: no acquisition under way) */
    do
    :: atomic {
#ifdef LIVENESS
        !pend[next_hold(c)] ->              /* (the clean-up of its id's last use has run) */
        want[c] = 1;
        h = next_hold(c);
        if :: fly[c] == h -> fly[c] = NONE; flytok[c] = 0 :: else -> skip fi  /* (ids are unique) */
#else
        acqs < acqs_of(c) ->                /* each acquisition has an id of its own */
        h = 2 * c + 1 + acqs; acqs++;
#endif
        hid[c] = h;
        mbox[c] = NONE; mtok[c] = 0;        /* a new Ticket */
        out[c] = 1                          /* _acquire._attempt: the first try is sent */
       };
        run_acquire(1);
        do                                  /* _queue.QueueClient.wait_queued */
        :: t != 0 -> break                  /* granted by the request's answer */
        :: atomic { t == 0 && mbox[c] == h -> /* the ticket has the hand-over's token */
            t = mtok[c]; mbox[c] = NONE; mtok[c] = 0;
            out[c] = 1; age[c] = qage[c];   /* confirmed_at = waiting.queued_at */
            break }
        :: atomic { t == 0 && mbox[c] != h -> /* the poll's time: ticket.clear(), token = None */
            mbox[c] = NONE; mtok[c] = 0;
            out[c] = 1; age[c] = 0 };
            run_acquire(0)
#ifdef LIVENESS
        :: t == 0 && c != 0 -> pend[h] = 1; want[c] = 0; goto next  /* cancelled (client 0 never is) */
#else
        :: atomic {                         /* cancelled, or its timeout passed: the answer */
            pend[h] = 1; t = 0;             /* is dropped, the hold given back */
            queued[c] = 0; qage[c] = 0; out[c] = 0; age[c] = 0; goto next }
        :: atomic { crashes < CRASHES -> crashes++; goto crash }
#endif
        od;
        atomic {                            /* _acquire._granted */
            tok[c] = t; t = 0;
            trust(c, age[c]);
#ifdef MUTANT_TRUST_SERVER_EXPIRY
            /* BUG: the deadline counted from the answer's arrival, as if the server's
               expiry were the client's own */
            trust(c, 0);
#endif
            out[c] = 0; age[c] = 0; queued[c] = 0; qage[c] = 0;
#ifdef LIVENESS
            want[c] = 0;
#else
            if
            :: dleft[c] == 0 -> pend[h] = 1; tok[c] = 0; goto next  /* too late: given back */
            :: else -> skip
            fi;
#endif
            inb[c] = 1;
            check()
        };
        do                                  /* the body, with the keeper renewing the lease */
#ifndef LIVENESS
        :: inb[c] && !out[c] -> out[c] = 1  /* _keeper.py: a renewal, sent now */
        :: atomic { out[c] ->
                renew_script(h);
                if
                :: r_got && inb[c] -> trust(c, age[c]);  /* HoldState._renewed(sent_at) */
                    if :: dleft[c] == 0 -> inb[c] = 0 :: else -> skip fi
                :: !r_got -> inb[c] = 0; dleft[c] = 0   /* not the holder: lost at once */
                :: else -> skip
                fi;
                out[c] = 0; age[c] = 0;
                check()
            }
        :: atomic { crashes < CRASHES -> crashes++; goto crash }
#endif
        :: !out[c] -> break                 /* the body ends, or was cancelled (inb is 0) */
        od;
        atomic { inb[c] = 0; dleft[c] = 0 };  /* the keeper drops the lease before the release is sent */
        atomic { release_script(h); tok[c] = 0; check() };
next:   skip
    od;
crash:
    atomic {
        dead[c] = 1; sub[c] = 0; inb[c] = 0; dleft[c] = 0; tok[c] = 0;
        out[c] = 0; age[c] = 0; queued[c] = 0; qage[c] = 0
#ifdef LIVENESS
        ; want[c] = 0
#endif
    }
}

init {
    atomic {
        run Client(0); run Client(1); run Cleaner(0); run Cleaner(1)
#if N > 2
        ; run Client(2); run Cleaner(2)
#endif
    }
}

#ifdef LIVENESS
/* a waiter is served while the others keep taking and releasing the lock */
ltl served { [] (want[0] -> <> inb[0]) }
#endif
