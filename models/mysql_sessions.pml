/*
 * The MySQL/MariaDB lock: named locks (GET_LOCK) held on a few sessions shared by
 * a client's holds, a session's end losing exactly its holds, the client's line of
 * waiters per key waiting in the server's own GET_LOCK queue on a session of its
 * own, and the token drawn in the statement that takes the lock.
 *
 * Mirrors, step by step (each step below names its source):
 *   asynclock/backends/mysql/_sql.py       TAKE (GET_LOCK(key, timeout) in the WHERE of an insert
 *                                          whose ON DUPLICATE KEY UPDATE draws the token,
 *                                          LAST_INSERT_ID(token + 1): the grant and its token in one
 *                                          statement), RELEASE (RELEASE_LOCK on the holding session)
 *   asynclock/backends/mysql/_grants.py    Grants.try_acquire / _try (a TAKE with no wait on a shared
 *                                          session; busy: the hold joins its key's line), hold_on,
 *                                          wait_take (the line's TAKE that waits), hand (a ping that
 *                                          proves the waiting session alive), let_go, release
 *   asynclock/backends/mysql/_lines.py     Lines.join, _wait_on (one session per line waits in the
 *                                          server; its grant goes to the first waiter still in line,
 *                                          else it is let go of), _grant (the session now holds the
 *                                          lock: the hold joins its holds), leave / _end_waits /
 *                                          _end_wait (the last waiter to leave ends the wait: KILL
 *                                          QUERY; a key granted meanwhile is let go of)
 *   asynclock/backends/mysql/_sessions.py  Sessions.get (any of max_leases sessions), for_waiting (a
 *                                          session without holds), ping (one per session proves all
 *                                          its holds), wait_timeout, silence (a request unanswered in
 *                                          time: the client closes the session), lost -> on_lost
 *   asynclock/backends/mysql/_backend.py   _session_lost: exactly the session's holds are lost
 *   asynclock/_holdstate.py, _keeper.py    deadline = send time + ttl - drift; the cohort timer
 *
 * The server (MySQL's metadata locks): a named lock is held by one session; a
 * GET_LOCK that cannot have it waits in the key's queue, first come first served,
 * and a released key (RELEASE_LOCK, the end of its session) is granted to its
 * first waiter within the release, whose statement then goes on (its token drawn
 * then). A session's end releases its locks and ends its wait. wait_timeout ends a
 * session idle TTL ticks (a session waiting in GET_LOCK is not idle).
 *
 * Clients: client A holds K1 (hold a1) from the start, and takes K0 (hold a0)
 * ACQS times, one after the other, on either of its sessions S1 and S2
 * (max_leases = 2); its line waits on one of them that has no holds. Client B
 * takes K0 once (hold b0) on its session S3, which also waits for B's line. A's
 * sessions end when wait_timeout passes (the client hearing of it later), or
 * when the client closes one (a request unanswered in time: it knows first); B's
 * session lives. A hold's deadline is its session's (the latest statement
 * answered on it, from its send), as in the PostgreSQL model. A waiter may give
 * up at any time it waits (it is the line's only waiter: its leaving ends the
 * wait); a wait whose session ended fails the acquire.
 *
 * Time: timers that run down, in ticks; a statement runs atomically, as it is
 * sent, its answer arriving in a later step. Bounds: one acquisition per hold;
 * one waiter per line (the order of a client's own waiters in its line is not
 * modelled); at most one session closed by the client; the clock stops when
 * every acquisition ended. Built with -DLIVENESS: no clock; a0 and b0 take and release
 * K0 for ever (a0 may give up waiting, b0 never does); A's sessions end twice, at
 * any time (opened again as new sessions); a wait statement runs out (its chunk)
 * twice, and is sent again; A's process may die holding K0, with nobody told (its
 * sessions end: the server grants the key to the first waiter within that end).
 */

#define NONE 0
#ifndef TTL
#define TTL 2
#endif
#define DRIFT 1
#ifndef ACQS
#define ACQS 1                 /* a0's acquisitions */
#endif
#define HOLDS 3                /* a0, a1 (client A), b0 (client B) */
#define B0 2
#define SESSIONS 4             /* 1, 2: client A's; 3: client B's */
#define key_of(h) (h == 1 -> 1 : 0)
#define of_a(s) (s != 3)

/* ---- the server ---- */
byte lk[2];                    /* the session holding each named lock (0: free) */
byte gq[2];                    /* K0's GET_LOCK queue: the sessions waiting, first at 0 */
byte gqn;
byte gtok[SESSIONS];           /* the token the waiting TAKE of a session drew when granted (0: none) */
bit salive[SESSIONS];          /* the session is open */
byte sidle[SESSIONS];          /* ticks until wait_timeout ends it */
byte seq;                      /* K0's row: the last token given */
byte lasttok;

/* ---- the clients ---- */
byte hsess[HOLDS];             /* the session a hold's lock is on (Hold.session) */
bit listed[HOLDS];             /* the hold is in its session's holds (Session.holds) */
bit inb[HOLDS];
byte tok[HOLDS];
byte sdl[SESSIONS];            /* ticks until the session's proof runs out (its holds are lost then) */
bit known[SESSIONS];           /* the client counts the session open */
bit opened[SESSIONS];          /* it was opened once (one that closed is not opened again) */
bit closing[SESSIONS];         /* the client closed it; the server ends it next */
bit waiting[SESSIONS];         /* it waits for a line (Session.waiting): it has no holds */
byte closes;
bit finished[HOLDS];

hidden byte s_i, s_k, s_n;

#ifdef LIVENESS
bit want[HOLDS];
bit crashed;                   /* client A's process died */
byte chunks;                   /* wait statements that ran out */
#define STMT(s) skip
#define DRAW(x) x = 1
#define FRESH(x) (!known[x] && !salive[x])    /* (closed: opened again, as a new session) */
#else
/* a statement reaches session s: the server's idle timer starts again */
#define STMT(s) sidle[s] = TTL
/* the next token of K0's row: LAST_INSERT_ID(token + 1) */
#define DRAW(x) seq++; x = seq
#define FRESH(x) (!opened[x])
#endif

/* properties: whoever is inside its body holds its key on the server, on the session
   its client counts it on (so at most one per key: a key has one session) */
inline check() {
    s_i = 0;
    do
    :: s_i < HOLDS -> assert(!inb[s_i] || (lk[key_of(s_i)] == hsess[s_i] && salive[hsess[s_i]])); s_i++
    :: else -> break
    od
}

/* the key is granted to the first waiting session, whose TAKE draws its token */
inline grant_first(k) {
    if
    :: k == 0 && gqn > 0 ->
        lk[0] = gq[0];
        DRAW(gtok[gq[0]]);                    /* within the grant */
        gq[0] = gq[1]; gq[1] = NONE; gqn--
    :: else -> lk[k] = NONE
    fi
}

/* RELEASE_LOCK(key) on session s: only the session that holds it lets it go */
inline release_on(k, s) {
    if :: lk[k] == s && salive[s] -> grant_first(k) :: else -> skip fi
}

inline out_of_queue(s) {
    if
    :: gqn > 0 && gq[0] == s -> gq[0] = gq[1]; gq[1] = NONE; gqn--
    :: gqn > 1 && gq[1] == s -> gq[1] = NONE; gqn--
    :: else -> skip
    fi
}

#define in_queue(s) ((gqn > 0 && gq[0] == s) || (gqn > 1 && gq[1] == s))

/* session s's proof from a statement sent `ago` ticks ago: its holds believe until
   send + ttl - drift (0..DRIFT later on a slow client clock) */
inline trust(s, ago) {
#ifndef LIVENESS
#ifdef MUTANT_NO_DRIFT_MARGIN
    s_k = TTL;                 /* BUG: the whole wait_timeout, with no allowance for a slow clock */
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

/* a session closed (the client finds it closed, or closes it): Sessions.lost ->
   _session_lost: every hold in session.holds is lost, no other */
inline closed(s) {
    known[s] = 0; sdl[s] = 0;
    s_n = inb[0] + 2 * inb[1] + 4 * inb[2];  /* (who believed before) */
    s_i = 0;
    do
    :: s_i < HOLDS ->
        if :: hsess[s_i] == s && listed[s_i] -> inb[s_i] = 0 :: else -> skip fi;
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

/* the server ends session s: its locks go (to their first waiters), its wait ends */
inline end_session(s) {
    out_of_queue(s);
    release_on(0, s);
    release_on(1, s);
    salive[s] = 0
}

#define dec(x) if :: x > 0 -> x-- :: else -> skip fi

#ifndef LIVENESS
/* one of client A's sessions: ends by wait_timeout, is closed by the client, is heard of */
#define A_SESSION(c) \
    :: atomic { salive[c] && sidle[c] == 0 && !in_queue(c) -> end_session(c); check() } \
    :: atomic { known[c] && !salive[c] -> closed(c); check() } \
    :: atomic { closes < 1 && known[c] && salive[c] -> closes++; closed(c); closing[c] = 1; check() } \
    :: atomic { closing[c] -> closing[c] = 0; end_session(c); check() }

active proctype Clock() {
    byte c;
end_time:
    do
    :: atomic {
        !(finished[0] && finished[1] && finished[2]) ->
        c = 1;
        do
        :: c < SESSIONS ->
            if :: salive[c] && of_a(c) && !in_queue(c) -> dec(sidle[c]) :: else -> skip fi;
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
#ifdef KILL_FROM_OUTSIDE
    /* that assumption dropped: KILL (or a restart, a failover) ends a session at any time */
    :: atomic { salive[1] -> end_session(1); check() }
    :: atomic { salive[2] -> end_session(2); check() }
#endif
    A_SESSION(1)
    A_SESSION(2)
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
#else
/* one of A's sessions ends (wait_timeout, a KILL, a restart): its locks go, the
   client hears of it and loses the holds on it */
active proctype Ending() {
    byte endings;                             /* (sessions end finitely often) */
end_ending:
    do
    :: atomic { endings < 2 && salive[1] && !crashed -> endings++; end_session(1); closed(1) }
    :: atomic { endings < 2 && salive[2] && !crashed -> endings++; end_session(2); closed(2) }
    od
}
#endif

/* a session of client A opened now if it never was (-DLIVENESS: or it closed) */
inline open(s) {
    if
    :: FRESH(s) -> opened[s] = 1; salive[s] = 1; known[s] = 1; STMT(s)
    :: else -> skip
    fi
}

/* Sessions.get: client A takes either of its sessions (not one waiting for a line),
   client B its one */
inline pick() {
    if
    :: h != B0 -> if :: !waiting[1] -> s = 1 :: !waiting[2] -> s = 2 fi; open(s)
    :: h == B0 -> s = 3
    fi
}

/* Sessions.for_waiting: a session without holds, else a new one */
#define NO_HOLDS(x) (!(listed[0] && hsess[0] == x) && !(listed[1] && hsess[1] == x))
inline pick_waiting() {
    if
    :: h != B0 ->
        if
        :: NO_HOLDS(1) && (known[1] || FRESH(1)) -> w = 1
        :: NO_HOLDS(2) && (known[2] || FRESH(2)) -> w = 2
        :: else -> w = NONE                  /* (none left in this model: the acquire fails) */
        fi;
        if :: w != NONE -> open(w) :: else -> skip fi
    :: h == B0 -> w = 3
    fi;
    if :: w != NONE -> waiting[w] = 1 :: else -> skip fi
}

proctype Hold(byte h) {
    byte s, w, k, got, n;
    bit line;                                 /* granted through the line */
    k = key_of(h);
end_idle:
    do
#ifdef LIVENESS
    :: want[h] = 1;
#else
    :: n < (h == B0 -> 1 : ACQS) ->
    n++;
#endif
    /* Grants._try: TAKE, GET_LOCK(key, 0), on a shared session (none known busy here:
       a client's only hold of K0 is this one) */
    atomic {
        pick();
        if
        :: known[s] && salive[s] ->
            STMT(s);
            if
            :: lk[k] == NONE ->
                lk[k] = s; DRAW(got);         /* taken, the token drawn by the same statement */
                trust(s, 0)
            :: else ->
                got = 0                       /* taken by another session: not taken */
            fi
        :: else -> got = 255                  /* the session is gone: the request fails */
        fi
    };
    if
    :: got == 255 -> goto done
    :: got != 0 && got != 255 -> goto granted
    :: else -> skip
    fi;
    /* busy: Lines.join; the line waits in the server on a session of its own (_wait_on,
       wait_take: TAKE with GET_LOCK(key, chunk)) */
    atomic {
        pick_waiting();
        if
        :: w != NONE && salive[w] ->
            STMT(w);
            gtok[w] = 0;
            if
            :: lk[k] == NONE -> lk[k] = w; DRAW(gtok[w])
            :: else -> gq[gqn] = w; gqn++
            fi
        :: else -> waiting[w] = 0; goto done
        fi
    };
wait:
    do
    :: atomic { gtok[w] != 0 && lk[k] == w ->  /* granted: the TAKE answers with its token */
            got = gtok[w]; gtok[w] = 0 };
        /* Grants.hand: a ping proves the session alive from now (then _grant) */
        atomic {
            if
            :: known[w] && salive[w] ->
                STMT(w); s = w; waiting[w] = 0; line = 1;
                if :: h != B0 -> trust(w, 0) :: else -> skip fi
            :: else -> waiting[w] = 0; goto done   /* the session is gone: the wait fails */
            fi
        };
        goto granted
    :: atomic { (!known[w] || !salive[w]) ->   /* the wait fails with its session */
            waiting[w] = 0; gtok[w] = 0 };
        goto done
#ifdef LIVENESS
    :: atomic { chunks < 2 && in_queue(w) ->  /* GET_LOCK(key, chunk) ran out: 0 rows */
            chunks++; out_of_queue(w) };
#ifndef MUTANT_NO_WAIT_AGAIN
        atomic {                              /* _wait_on: sent again while the line has waiters */
            if
            :: known[w] && salive[w] && lk[k] == NONE -> lk[k] = w; DRAW(gtok[w])
            :: known[w] && salive[w] && lk[k] != NONE -> gq[gqn] = w; gqn++
            :: else -> skip                   /* (its session is gone: the wait fails, below) */
            fi
        };
#endif
        goto wait                             /* (BUG without it: the waiter waits for nothing) */
    :: h != B0 ->
#else
    ::
#endif
        atomic {                              /* gives up: Lines.leave, the last to leave ends */
            waiting[w] = 0;                   /* the wait: KILL QUERY (a key granted is let go of) */
            out_of_queue(w);
#ifndef MUTANT_KILL_KEEPS_GRANT
            release_on(k, w);
#endif
            gtok[w] = 0;
            /* property: a cancelled acquire holds nothing and waits in no queue */
            assert(lk[k] != w && !in_queue(w))
        };
        goto done
    od;
granted:
    atomic {                                  /* Grants.hold_on, or (line) Lines._grant: the */
        if                                    /* hold joins its session's holds */
        :: !(known[s] && salive[s]) -> goto done   /* the session closed meanwhile: the request
                                                      failed (its lock went with the session) */
        :: else -> skip
        fi;
        hsess[h] = s; tok[h] = got; got = 0;
#ifdef MUTANT_GRANT_NOT_ON_SESSION
        listed[h] = !line;                    /* BUG: _grant forgets session.holds.add(record) */
#else
        listed[h] = 1;
#endif
#ifndef LIVENESS
        if :: h != B0 && sdl[s] == 0 -> goto release :: else -> skip fi   /* too late: given back */
        assert(tok[h] > lasttok);            /* property: K0's tokens strictly increase per grant */
        lasttok = tok[h];
#else
        want[h] = 0;
#endif
        inb[h] = 1;
        check()
    };
#ifdef LIVENESS
    if
    :: h == 0 && !crashed ->                 /* client A's process dies holding K0: its sessions */
        atomic {                             /* end (their locks go), nobody is told */
            crashed = 1; inb[h] = 0;
            if :: salive[1] -> end_session(1) :: else -> skip fi;
            if :: salive[2] -> end_session(2) :: else -> skip fi
        };
        goto dead
    :: else -> skip
    fi;
#endif
release:
    /* the body ends (or was cancelled, or lost); RELEASE on its session */
    atomic { inb[h] = 0 };
    atomic {
        if
        :: known[s] -> STMT(s); release_on(k, s)
#ifdef MUTANT_ROW_DELETED_AT_RELEASE
            ; if :: k == 0 -> seq = 0 :: else -> skip fi   /* BUG: the key's row deleted: tokens start again */
#endif
        :: else -> skip
        fi;
        hsess[h] = NONE; listed[h] = 0; tok[h] = 0;
        check()
    };
done:
    atomic { s = 0; w = 0; got = 0; line = 0 }
#ifndef LIVENESS
    :: else -> break
#endif
    od;
#ifdef LIVENESS
dead:
    skip
#else
    finished[h] = 1
#endif
}

#ifndef LIVENESS
/* a1: client A's hold of K1, which nobody else wants: it holds from the start, on
   either of A's sessions, until released */
inline other_holds() {
    if :: hsess[1] = 1 :: hsess[1] = 2 fi;
    open(hsess[1]);
    lk[1] = hsess[1]; listed[1] = 1; tok[1] = 1;
    trust(hsess[1], 0);
    inb[1] = 1
}

proctype Other() {
    atomic { inb[1] = 0 };                    /* the body ends, or its session's loss ended it */
    atomic {
        if :: known[hsess[1]] -> release_on(1, hsess[1]) :: else -> skip fi;
        hsess[1] = NONE; listed[1] = 0; tok[1] = 0;
        finished[1] = 1;
        check()
    }
}
#endif

init {
    atomic {
        salive[3] = 1; known[3] = 1; opened[3] = 1;
        run Hold(0); run Hold(2)
#ifndef LIVENESS
        ; other_holds(); run Other()
#endif
    }
}

#ifdef LIVENESS
ltl served { [] (want[B0] -> <> inb[B0]) }
#endif
