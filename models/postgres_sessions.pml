/*
 * The PostgreSQL lock: session-level advisory locks, holds multiplexed on a few
 * sessions, a session's end losing exactly its holds, and the FIFO queue table
 * whose waiters are woken by NOTIFY.
 *
 * Mirrors, step by step (each step below names its source):
 *   asynclock/backends/postgres/_sql.py       TRY (take the key; with the key's marker taken, let go
 *                                             again and answer -1), RELEASE (unlock; bit 1: waiters
 *                                             queued), WAKE (NOTIFY the first live row), ENQUEUE, HEAD
 *                                             (only the first live row takes the key; its row goes, the
 *                                             next is told), LEAVE, PING
 *   asynclock/backends/postgres/_grants.py    Grants.try_acquire / _try / head_try / release, _hold_on
 *                                             (the hold joins its session's holds)
 *   asynclock/backends/postgres/_queue.py     Queue.count_in (the marker before the row), enqueue, wait
 *                                             (woken by a notification, or looking again by itself), leave
 *   asynclock/backends/postgres/_sessions.py  Sessions.get (any of max_leases sessions), ping (one per
 *                                             session proves all its holds), idle_session_timeout,
 *                                             _check_inflight (a request unanswered in time: the client
 *                                             closes the session), _closed -> on_lost(session)
 *   asynclock/backends/postgres/_backend.py   on_lost: exactly the session's holds are lost
 *   asynclock/_holdstate.py, _keeper.py       deadline = send time + ttl - drift; the cohort timer
 *
 * Clients: client A holds two keys at once, K0 (hold a0) and K1 (hold a1), each on
 * either of its sessions S1 and S2 (max_leases = 2); client B wants K0 (hold b0) on
 * its session S3. A's sessions end when the server's idle_session_timeout passes
 * (TTL ticks after the last statement it received), the client hearing of it
 * later; or when the client closes one (a request unanswered in time), the server
 * ending it after. B's session and every listening session live throughout (so
 * every queue row is live).
 *
 * Time: timers that run down, in ticks. A hold on A's session believes while the
 * latest statement answered on that session, counted from its send, is younger
 * than TTL - DRIFT on a client clock that may fall DRIFT behind (per session: the
 * pings renew every hold on it at once; a hold's own first deadline from its TRY
 * is never later than that). A statement runs atomically, as it is sent (latency
 * before it runs would only make the server's idle timer start later than the
 * client's deadline: the boundary case is a statement run as sent); its answer
 * arrives in a later step.
 *
 * Bounds: one acquisition per hold; at most one session closed by the client; the
 * clock stops when every acquisition ended. Built with -DLIVENESS: no clock; a0 and
 * b0 take and release K0 for ever; A's sessions end twice, at any time, and A's
 * process may die holding K0, with nobody notified (the first waiter then looks
 * again by itself).
 */

#define NONE 0
#ifndef TTL
#define TTL 2
#endif
#define DRIFT 1
#define HOLDS 3                /* a0, a1 (client A), b0 (client B) */
#define B0 2
#define SESSIONS 4             /* 1, 2: client A's; 3: client B's */
#define key_of(h) (h == 1 -> 1 : 0)

/* ---- the server ---- */
byte lk[2];                    /* the session holding each advisory key (0: free) */
bit salive[SESSIONS];          /* the session is open */
byte sidle[SESSIONS];          /* ticks until idle_session_timeout ends A's session */
byte row[2];                   /* the queue table's rows for K0, in ticket order: hold + 1 */
byte rows;
bit note[HOLDS];               /* a notification to the hold's client: 't <hold>' (try now) */
byte seq;                      /* the token sequence */
byte lasttok;

/* ---- the clients ---- */
byte hsess[HOLDS];             /* the session a hold's lock is on (Hold.session) */
bit listed[HOLDS];             /* the hold is in its session's holds (Session.holds) */
bit inb[HOLDS];
byte tok[HOLDS];
byte sdl[SESSIONS];            /* ticks until the session's proof runs out (its holds are lost then) */
bit known[SESSIONS];           /* the client counts the session open */
bit closing[SESSIONS];         /* the client closed it; the server ends it next */
byte sgen[SESSIONS];           /* the session's incarnation (-DLIVENESS: one opened again is another) */
byte closes;
bit marked[HOLDS];             /* counted in K0's marker (the listening session holds it shared) */
bit sent[HOLDS];               /* a statement of the hold in flight (sent as it runs: answered later) */
bit finished[HOLDS];
#ifdef LIVENESS
bit want[HOLDS];
bit crashed;                   /* client A's process died */
#endif

hidden byte s_i, s_k, s_n;

#ifdef LIVENESS
#define STMT(s) skip
#define SEQ_NEXT got = 1
#else
/* a statement reaches session s: the server's idle timer starts again */
#define STMT(s) if :: s < 3 -> sidle[s] = TTL :: else -> skip fi
#define SEQ_NEXT if :: k == 0 -> seq++; got = seq :: else -> got = 1 fi   /* (K1's tokens: not followed) */
#endif

/* K0's marker is taken: some client has a waiter counted in */
#define MARKER (marked[0] || marked[B0])

/* properties: whoever is inside its body holds its key on the server, on the session
   its client counts it on (so at most one per key: a key has one session) */
inline check() {
    s_i = 0;
    do
    :: s_i < HOLDS -> assert(!inb[s_i] || (lk[key_of(s_i)] == hsess[s_i] && salive[hsess[s_i]])); s_i++
    :: else -> break
    od
}

/* WAKE (and HEAD's, LEAVE's notice): NOTIFY the first live row's client */
inline wake() {
    if :: rows > 0 -> note[row[0] - 1] = 1 :: else -> skip fi
}

/* property: a newcomer takes K0 only with nobody else's row queued for it */
inline fifo(h) {
    s_i = 0;
    do
    :: s_i < rows -> assert(row[s_i] == h + 1); s_i++
    :: else -> break
    od
}

inline drop_row(h) {
    if
    :: rows > 0 && row[0] == h + 1 -> row[0] = row[1]; row[1] = NONE; rows--
    :: rows > 1 && row[1] == h + 1 -> row[1] = NONE; rows--
    :: else -> skip
    fi
}

/* session s's proof from a statement sent `ago` ticks ago: its holds believe until
   send + ttl - drift (0..DRIFT later on a slow client clock) */
inline trust(s, ago) {
#ifndef LIVENESS
#ifdef MUTANT_NO_DRIFT_MARGIN
    s_k = TTL;                 /* BUG: the whole idle timeout, with no allowance for a slow clock */
#else
    s_k = TTL - DRIFT;
#endif
    if :: skip :: s_k = s_k + DRIFT fi;
    s_k = (s_k > ago -> s_k - ago : 0);
    if :: s_k > sdl[s] -> sdl[s] = s_k :: else -> skip fi
#else
    skip
#endif
}

/* a session closed (its termination listener, or the client closing it):
   Sessions._closed -> on_lost(session): every hold in session.holds is lost, no other */
inline closed(s) {
    known[s] = 0; sdl[s] = 0;
    s_n = inb[0] + 2 * inb[1] + 4 * inb[2];  /* (who believed before) */
    s_i = 0;
    do
    :: s_i < HOLDS ->
#ifdef MUTANT_LOSE_CLIENTS_HOLDS
        if :: s_i != B0 && hsess[s_i] != NONE -> inb[s_i] = 0   /* BUG: every hold of the client */
#else
        if :: hsess[s_i] == s && listed[s_i] -> inb[s_i] = 0
#endif
           :: else -> skip
        fi;
        s_i++
    :: else -> break
    od;
    /* property: exactly its holds: none on it believes, the others as before */
    s_i = 0;
    do
    :: s_i < HOLDS ->
        assert(hsess[s_i] != s || !inb[s_i]);
        assert(hsess[s_i] == s || inb[s_i] == ((s_n >> s_i) & 1));
        s_i++
    :: else -> break
    od
}

/* the server ends session s: its advisory locks go */
inline end_session(s) {
    salive[s] = 0;
    if :: lk[0] == s -> lk[0] = NONE :: else -> skip fi;
    if :: lk[1] == s -> lk[1] = NONE :: else -> skip fi
}

#define dec(x) if :: x > 0 -> x-- :: else -> skip fi

#ifndef LIVENESS
active proctype Clock() {
    byte c;
end_time:
    do
    :: atomic {
        !(finished[0] && finished[1] && finished[2]) ->
        c = 1;
        do
        :: c < 3 ->
            if :: salive[c] -> dec(sidle[c]) :: else -> skip fi;
            if                               /* the cohort timer: the session's holds are lost */
            :: sdl[c] > 0 -> sdl[c]--;
                if
                :: sdl[c] == 0 ->
                    if :: hsess[0] == c -> inb[0] = 0 :: else -> skip fi;
                    if :: hsess[1] == c -> inb[1] = 0 :: else -> skip fi
                :: else -> skip
                fi
            :: else -> skip
            fi;
            c++
        :: else -> break
        od;
        check()
       }
    /* idle_session_timeout: the server ends one of A's sessions (KILL_FROM_OUTSIDE:
       that assumption dropped, pg_terminate_backend or a restart ends it at any time) */
#ifdef KILL_FROM_OUTSIDE
    :: atomic { salive[1] -> end_session(1); check() }
    :: atomic { salive[2] -> end_session(2); check() }
#else
    :: atomic { salive[1] && sidle[1] == 0 -> end_session(1); check() }
    :: atomic { salive[2] && sidle[2] == 0 -> end_session(2); check() }
#endif
    /* the client's termination listener hears of an ended session */
    :: atomic { known[1] && !salive[1] -> closed(1); check() }
    :: atomic { known[2] && !salive[2] -> closed(2); check() }
    /* a request unanswered in time: the client closes the session (losing its holds at
       once), the server ends it after */
    :: atomic { closes < 1 && known[1] && salive[1] -> closes++; closed(1); closing[1] = 1; check() }
    :: atomic { closes < 1 && known[2] && salive[2] -> closes++; closed(2); closing[2] = 1; check() }
    :: atomic { closing[1] -> closing[1] = 0; end_session(1); check() }
    :: atomic { closing[2] -> closing[2] = 0; end_session(2); check() }
    od
}

/* the watchdog: a ping on a session with holds proves every hold on it */
active proctype Pinger() {
end_ping:
    do
    :: atomic { known[1] && salive[1] && sdl[1] > 0 -> STMT(1); trust(1, 0); check() }
    :: atomic { known[2] && salive[2] && sdl[2] > 0 -> STMT(2); trust(2, 0); check() }
    od
}
#endif

/* Sessions.get: client A takes either of its sessions, client B its one; `g`: the
   session's incarnation. (A session the client knows closed is not taken again: the
   acquire fails; with -DLIVENESS it is opened again, as a new session.) */
inline pick() {
    if
    :: h != B0 ->
        if :: s = 1 :: s = 2 fi;
        if
        :: !known[s] && !salive[s] && (sgen[s] == 0
#ifdef LIVENESS
                                       || 1
#endif
                                       ) -> salive[s] = 1; known[s] = 1; sgen[s] = 1 - sgen[s]; STMT(s)
        :: else -> skip
        fi
    :: h == B0 -> s = 3
    fi;
    g = sgen[s]
}

/* the request's session is still the one it was sent on, and open as far as the
   client knows (a request on a session that closes fails) */
#define SAME_SESSION (known[s] && sgen[s] == g)

/* one hold's acquisition (Grants.try_acquire, Queue.wait, Grants.release) */
proctype Hold(byte h) {
    byte s, g, k, got;
    k = key_of(h);
#ifdef LIVENESS
    if :: h == 1 -> goto finish :: else -> skip fi;  /* (a1 takes no part: K1 is not contended) */
end_idle:
    do
    :: want[h] = 1;
#endif
    atomic { pick(); sent[h] = 1 };
    if :: !SAME_SESSION -> goto finish :: else -> skip fi;  /* (closed for good: the acquire fails) */
    /* TRY: the key, then its marker: taken while waiters are queued, it is let go again */
    atomic {
        STMT(s);
        if
        :: lk[k] == NONE && salive[s] ->
            if
#ifdef MUTANT_NEWCOMER_IGNORES_MARKER
            :: false -> skip                 /* BUG: the marker is not looked at */
#else
            :: k == 0 && MARKER -> wake(); got = 0   /* free, but waiters are queued: they go first */
#endif
            :: else ->                        /* taken, with a token */
                if :: k == 0 -> fifo(h) :: else -> skip fi;
                lk[k] = s; SEQ_NEXT;
                if :: h != B0 -> trust(s, 0) :: else -> skip fi  /* (sent as it runs: see the top) */
            fi
        :: lk[k] != NONE && salive[s] -> got = 0   /* somebody holds it */
        :: else -> got = 255                 /* the session is gone: the request fails */
        fi
    };
    if
    :: got == 255 -> goto finish
    :: got != 0 && got != 255 -> goto granted
    :: else -> skip
    fi;
    /* queued: counted in the marker, the row put in (Queue.enqueue), then tries */
    atomic { marked[h] = 1; row[rows] = h + 1; rows++; sent[h] = 0 };
    do
    /* woken by a notification ('t'), or looking again by itself (the first in line
       every request window, the others every ttl: a holder's session that just ends
       notifies nobody): head_try */
#ifdef MUTANT_NO_LOOK_AGAIN
    :: atomic { sent[h] == 0 && note[h] -> sent[h] = 1; note[h] = 0; pick() }   /* BUG: notified only */
#else
    :: atomic { sent[h] == 0 -> sent[h] = 1; note[h] = 0; pick() }
#endif
        atomic {                             /* HEAD: only the first row takes the key */
            STMT(s);
            if
            :: row[0] == h + 1 && lk[k] == NONE && salive[s] && SAME_SESSION ->
                lk[k] = s; SEQ_NEXT;
                if :: h != B0 -> trust(s, 0) :: else -> skip fi;
                drop_row(h);
                wake()                        /* the next row is told it is first */
            :: else -> skip
            fi;
            if :: got == 0 -> sent[h] = 0 :: else -> skip fi
        };
        if :: got != 0 -> break :: else -> skip fi
#ifdef LIVENESS
    :: h != B0 && sent[h] == 0 -> goto cancelled          /* b0 never gives up */
#else
    :: sent[h] == 0 -> goto cancelled                      /* cancelled, or its timeout passed */
#endif
    od;
    atomic { marked[h] = 0 };
granted:
    atomic {                                 /* _hold_on: the hold joins its session's holds */
        if
        :: !SAME_SESSION -> goto finish      /* the session closed meanwhile: the request
                                                failed (and its lock went with the session) */
        :: else -> skip
        fi;
        hsess[h] = s; tok[h] = got; got = 0;
#ifdef MUTANT_HOLD_NOT_ON_SESSION
        listed[h] = (h != 0);                /* BUG: session.holds.add(record) forgotten (a0's) */
#else
        listed[h] = 1;
#endif
#ifndef LIVENESS
        if :: h != B0 && sdl[s] == 0 -> goto release :: else -> skip fi   /* too late: given back */
        assert(tok[h] > lasttok || k == 1);  /* property: K0's tokens strictly increase per grant */
        if :: k == 0 -> lasttok = tok[h] :: else -> skip fi;
#else
        want[h] = 0;
#endif
        sent[h] = 0;
        inb[h] = 1;
        check()
    };
#ifdef LIVENESS
    if
    :: h == 0 && !crashed ->                 /* client A's process dies holding K0: its sessions */
        atomic {                             /* end (their locks go), nobody is notified */
            crashed = 1; inb[h] = 0;
            if :: salive[1] -> end_session(1) :: else -> skip fi;
            if :: salive[2] -> end_session(2) :: else -> skip fi
        };
        goto dead
    :: else -> skip
    fi;
#endif
release:
    /* the body ends (or was cancelled, or lost); RELEASE on its session, WAKE if waiters */
    atomic { inb[h] = 0 };
    atomic {
        STMT(s);
        if :: lk[k] == s && salive[s] && SAME_SESSION -> lk[k] = NONE :: else -> skip fi;
        if :: k == 0 && MARKER -> wake() :: else -> skip fi;
        hsess[h] = NONE; listed[h] = 0; tok[h] = 0;
        check()
    };
    goto finish;
cancelled:
    /* Queue.leave: its row goes (LEAVE), the next is told to try in its place */
    atomic {
        drop_row(h); marked[h] = 0; note[h] = 0; wake();
        assert(lk[k] != s);                  /* property: a cancelled acquire holds nothing ... */
        s_i = 0;
        do :: s_i < rows -> assert(row[s_i] != h + 1); s_i++ :: else -> break od   /* ... no row */
    };
finish:
    atomic { s = 0; g = 0; got = 0; sent[h] = 0 };
#ifdef LIVENESS
    od;
dead:
    skip
#else
    finished[h] = 1
#endif
}

#ifndef LIVENESS
/* a1: client A's hold of K1, which nobody else wants: it holds from the start, on
   either of A's sessions (so a0's hold shares its session, or not), until released */
inline other_holds() {
    if :: hsess[1] = 1 :: hsess[1] = 2 fi;
    salive[hsess[1]] = 1; known[hsess[1]] = 1; sgen[hsess[1]] = 1; STMT(hsess[1]);
    lk[1] = hsess[1]; listed[1] = 1; tok[1] = 1;
    trust(hsess[1], 0);
    inb[1] = 1
}

proctype Other() {
    atomic { inb[1] = 0 };                    /* the body ends, or its session's loss ended it */
    atomic {
        if :: lk[1] == hsess[1] && salive[hsess[1]] && known[hsess[1]] -> lk[1] = NONE :: else -> skip fi;
        hsess[1] = NONE; listed[1] = 0; tok[1] = 0;
        finished[1] = 1;
        check()
    }
}
#endif

#ifdef LIVENESS
/* one of A's sessions ends (idle timeout, a restart): its locks go, nobody is
   notified; the client hears of it and loses the holds on it */
active proctype Ending() {
    byte endings;                             /* (sessions end finitely often) */
end_ending:
    do
    :: atomic { endings < 2 && salive[1] -> endings++; end_session(1); closed(1) }
    :: atomic { endings < 2 && salive[2] -> endings++; end_session(2); closed(2) }
    od
}
#endif

init {
    atomic {
        salive[3] = 1; known[3] = 1; run Hold(0); run Hold(2)
#ifndef LIVENESS
        ; other_holds(); run Other()
#endif
    }
}

#ifdef LIVENESS
ltl served { [] (want[B0] -> <> inb[B0]) }
#endif
