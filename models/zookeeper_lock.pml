/*
 * The ZooKeeper lock: ephemeral sequential nodes, the predecessor watch, the
 * session as the lease, and a foreign client (Curator's recipe) in the same queue.
 *
 * Mirrors, step by step (each step below names its source):
 *   asynclock/backends/zookeeper/_recipe.py   Recipe.advance (create + getChildren in one write, look,
 *                                             wait on the predecessor), Recipe._look, Recipe._wait (a
 *                                             deleted predecessor: hold without reading again only if
 *                                             it was the only contender ahead)
 *   asynclock/backends/zookeeper/_order.py    contenders_of (by sequence number), first_holds
 *   asynclock/backends/zookeeper/_nodes.py    Nodes.create (a lost create answer leaves the node
 *                                             uncertain), Nodes._adopt / cleanup (found again by its GUID)
 *   asynclock/backends/zookeeper/_holds.py    Holds.renew (exists on the held node: the heartbeat),
 *                                             Holds.release, Holds.on_expired (every hold lost)
 *   asynclock/backends/zookeeper/__init__.py  try_acquire / wait_queued: Acquired(czxid,
 *                                             confirmed_at=session.confirmed_at); lease_time
 *   asynclock/backends/zookeeper/_layout.py   lease_time_of: the session timeout less 10 % + 5 ms
 *   asynclock/_holdstate.py, _keeper.py       deadline = confirmed_at + lease_time - drift; the cohort timer
 *   Curator's InterProcessMutex (StandardLockInternalsDriver, LockInternals.internalLockLoop):
 *                                             create, list, the lowest holds, else watch the node just
 *                                             below (getData) and list again when it fires
 *
 * Time: timers that run down, in ticks. The session timeout is SESSION ticks:
 * the server may expire a session once SESSION ticks passed since it last
 * received a request of it (ZooKeeper never expires it sooner). A client's lease
 * counts from the send time of the last request the server answered (the session's
 * confirmed_at), for SESSION - MARGIN ticks on its own clock, which may fall up to
 * MARGIN ticks behind over a lease (the 10 % + 5 ms margin and the front's drift
 * allowance, one tick together here).
 *
 * Each server operation is atomic (ZooKeeper applies writes in one order); a
 * client's requests are sent and answered in separate steps, answered in order.
 * A watch fires with the deletion it watches. The foreign client (Curator) follows
 * its own recipe on the same nodes; its session never expires here (what Curator
 * does when its own session expires is Curator's concern).
 *
 * Bounds: NA asynclock clients and one Curator client, one acquisition each; at
 * most EXPIRIES session expiries; the clock stops once every acquisition ended.
 * Built with -DLIVENESS: no clock (no expiry), clients that take and release the
 * lock for ever, connections that drop (losing their watches).
 */

#define NA 2                   /* asynclock clients: 0 .. NA-1; the Curator client is NA */
#define CURATOR NA
#define K (NA + 1)             /* contenders */
#ifndef SESSION
#define SESSION 3              /* session timeout, in ticks */
#endif
#define MARGIN 1               /* lease_time_of's margin plus the drift allowance */
#ifndef EXPIRIES
#define EXPIRIES 1
#endif

#define NONE 0

/* Client 0 is the frail one: its session may expire (it is paused, or cut off),
   its create's answer may be lost, it may give up waiting. Client 1's session
   lives throughout and it waits to the end (its clock is not followed). With
   -DLIVENESS, client 0 waits to the end and client 1 may give up. */
#ifdef LIVENESS
#define MAY_CANCEL(c) (c != 0)
#define MORTAL(c) (0)
#else
#define MAY_CANCEL(c) (c == 0)
#define MORTAL(c) (c == 0)
#endif

/* ---- the server ---- */
byte node[K];                  /* each client's contender node: its sequence number = czxid (0: none) */
byte zxid;                     /* the last sequence number given */
bit sgone[NA];                 /* the client's session expired on the server (its nodes are gone) */
byte sleft[NA];                /* ticks until the server may expire the session (SESSION after the last request) */
byte watch[K];                 /* the node a client watches (getData with a watch) */
bit fired[K];                  /* its watch fired (the node went) */
byte expiries;
byte lasttok;                  /* the last token granted (for the property) */

/* ---- each client ---- */
bit inb[K];                    /* inside its body: believes it holds */
byte tok[K];
byte dleft[NA];                /* ticks until its trusted deadline */
bit out[NA];                   /* a request in flight ... */
byte age[NA];                  /* ... sent this many ticks ago */
byte cage[NA];                 /* ticks since the send of the session's last answered request */
bit known[K];                  /* the client knows its node (a lost create answer: not yet) */
byte below[K];                 /* contenders below its node at its last look */
bit pend[NA];                  /* a cancelled acquire whose node is still to be deleted */
bit finished[K];                   /* its acquisition is over */
#ifdef LIVENESS
bit want[K];
#endif

byte pseq[NA];                 /* the predecessor's sequence number at its last look */
byte czxid[K];                 /* its node's czxid, as its create (or adopt) answered */

hidden byte s_i, s_j, s_n, s_low, s_pred, s_r;

/* the contenders below `c`'s node (s_n), and the one just below it (s_pred: its
   client + 1) */
inline look(c) {
    s_n = 0; s_pred = NONE; s_i = 0;
    do
    :: s_i < K ->
        if
        :: node[s_i] != NONE && node[s_i] < node[c] ->
            s_n++;
            if :: s_pred == NONE -> s_pred = s_i + 1
               :: s_pred != NONE && node[s_i] > node[s_pred - 1] -> s_pred = s_i + 1
               :: else -> skip fi
        :: else -> skip
        fi;
        s_i++
    :: else -> break
    od
}

#ifdef MUTANT_ORDER_BY_NAME
/* the contenders below `c` when the names are compared whole: the GUID decides
   (here: the client's index, Curator's sorting first), not the creation order */
inline look_names(c) {
    s_n = 0; s_pred = NONE; s_i = 0;
    do
    :: s_i < K ->
        if
        :: node[s_i] != NONE && (s_i == CURATOR || s_i < c) && s_i != c -> s_n++; s_pred = s_i + 1
        :: else -> skip
        fi;
        s_i++
    :: else -> break
    od
}
#endif

#ifdef LIVENESS
/* (no tokens without a clock: the sequence numbers are kept as ranks, so the
   search stays finite) */
inline renumber() {
    s_r = 1;
    do
    :: s_r > zxid -> break
    :: s_r <= zxid ->
        s_j = 0; s_n = 0;                       /* is s_r some node's number? */
        do :: s_j < K -> if :: node[s_j] == s_r -> s_n = 1 :: else -> skip fi; s_j++ :: else -> break od;
        if
        :: s_n -> s_r++
        :: else ->                              /* a gap: the numbers above it move down */
            s_j = 0;
            do
            :: s_j < K -> if :: node[s_j] > s_r -> node[s_j]-- :: else -> skip fi; s_j++
            :: else -> break
            od;
            s_j = 0;
            do
            :: s_j < NA -> if :: pseq[s_j] == s_r -> pseq[s_j] = 255  /* (its node is gone) */
                              :: pseq[s_j] > s_r && pseq[s_j] != 255 -> pseq[s_j]--
                              :: else -> skip fi; s_j++
            :: else -> break
            od;
            zxid--
        fi
    od
}
#define CREATE(c) zxid++; node[c] = zxid; renumber()
#else
#define CREATE(c) zxid++; node[c] = zxid
#endif

/* ZooKeeper deletes a node: a watch on it fires */
inline delete_node(c) {
    s_j = 0;
    do
    :: s_j < K -> if :: watch[s_j] == c + 1 -> fired[s_j] = 1; watch[s_j] = NONE :: else -> skip fi; s_j++
    :: else -> break
    od;
    node[c] = NONE
}

/* properties: at most one client believes it holds, and it is the lowest live
   contender; its token is its node's czxid */
inline check() {
    s_j = 0; s_low = 0;
    do
    :: s_j < K ->
        if
        :: inb[s_j] ->
            s_low++;
            assert(s_low == 1);
#ifndef LIVENESS
            assert(node[s_j] != NONE && node[s_j] == tok[s_j]);
#endif
            look(s_j); assert(s_n == 0)
        :: else -> skip
        fi;
        s_j++
    :: else -> break
    od
}

#define ALIVE(c) (!sgone[c])
#define TOUCH(c) if :: MORTAL(c) -> sleft[c] = SESSION :: else -> skip fi
/* the request in flight answered: the session's confirmed_at moves up to its send time */
#define ANSWERED(c) if :: age[c] < cage[c] -> cage[c] = age[c] :: else -> skip fi; out[c] = 0; age[c] = 0

/* the lease of a hold proved by a request sent `ago` ticks ago: lease_time_of
   (timeout) - drift(ttl), on a client clock that may lose MARGIN */
inline trust(c, ago) {
#ifndef LIVENESS
#ifdef MUTANT_NO_LEASE_MARGIN
    s_low = SESSION;                         /* BUG: the whole session timeout is trusted */
#else
    s_low = SESSION - MARGIN;
#endif
    if :: skip :: s_low = s_low + MARGIN fi;
    dleft[c] = (s_low > ago -> s_low - ago : 0)
#else
    skip
#endif
}

#define dec(x) if :: x > 0 -> x-- :: else -> skip fi
#define inc(x) if :: x < SESSION + MARGIN -> x++ :: else -> skip fi

#ifndef LIVENESS
active proctype Clock() {
    byte c;
end_time:
    do
    :: atomic {
        !(finished[0] && finished[1] && finished[CURATOR]) ->
        dec(sleft[0]);                          /* (only client 0's clock is followed) */
        if :: inb[0] -> dleft[0]--; if :: dleft[0] == 0 -> inb[0] = 0 :: else -> skip fi
           :: else -> skip fi;
        if :: out[0] -> inc(age[0]) :: else -> skip fi;
        inc(cage[0]);
        check()
       }
    /* the server expires a session SESSION ticks after its last request: its
       ephemeral nodes go, and their watches fire */
    :: atomic {
        expiries < EXPIRIES && sleft[0] == 0 && !sgone[0] ->
        expiries++;
        c = 0;
        sgone[c] = 1;
        if :: node[c] != NONE -> delete_node(c) :: else -> skip fi;
        check()
       }
    od
}
#endif

/* a cancelled acquire's node deleted (Holds.release, or Nodes.cleanup in the
   background): by its path, or, after a lost create answer, found by its GUID among
   the children; moot once the session is over (its nodes went with it) */
proctype Cleaner(byte c) {
end_clean:
    do
    :: atomic {
        pend[c] ->
        if
        :: !sgone[c] && node[c] != NONE ->
#ifdef MUTANT_CLEANUP_SKIPS_UNCERTAIN
            if :: known[c] -> delete_node(c) :: else -> skip fi  /* BUG: an unanswered create is forgotten */
#else
            delete_node(c)
#endif
        :: else -> skip                          /* (moot: the session's nodes are gone) */
        fi;
        assert(sgone[c] || node[c] == NONE);     /* property: a cancelled acquire leaves no node */
        pend[c] = 0; known[c] = 0;
        check()
       }
    od
}

/* ---- an asynclock client: Recipe.advance ---- */
proctype Client(byte c) {
#ifdef LIVENESS
end_idle:
    do
    :: atomic { !pend[c] -> want[c] = 1 };
#endif
again:
    out[c] = 1;                                 /* Nodes.create: create and getChildren, written together */
    atomic {
        if
        :: !ALIVE(c) -> goto expired
        :: else -> CREATE(c); TOUCH(c)
        fi;
        if
        :: known[c] = 1; czxid[c] = node[c]      /* the create is answered ... */
        :: MORTAL(c) -> known[c] = 0             /* ... or its answer is lost with the connection */
        fi
    };
    if
    :: !known[c] ->
        if
        :: atomic { if :: !ALIVE(c) -> goto expired :: else -> TOUCH(c); known[c] = 1; czxid[c] = node[c] fi }  /* Nodes._adopt */
        :: goto cancelled                       /* cancelled meanwhile: its node is found by the clean-up */
        fi
    :: else -> skip
    fi;
relook:
    atomic {                                    /* Recipe._look: the contenders, in order */
        if
        :: !ALIVE(c) -> goto expired
        :: node[c] == NONE -> out[c] = 0; age[c] = 0; goto again   /* our node went: queue again */
        :: else -> TOUCH(c);
#ifdef MUTANT_ORDER_BY_NAME
            look_names(c);                      /* BUG: contenders ordered by their names, not sequence */
#else
            look(c);                            /* contenders_of: ordered by the sequence number */
#endif
            below[c] = s_n;
            if :: s_pred != NONE -> pseq[c] = node[s_pred - 1] :: else -> pseq[c] = 0 fi;
            watch[c] = NONE; fired[c] = 0
        fi;
        ANSWERED(c)
    };
    do
    :: below[c] == 0 -> break                   /* first_holds: the lowest holds */
    :: below[c] > 0 ->
        out[c] = 1;                             /* getData(predecessor, watch) */
        atomic {
            if
            :: !ALIVE(c) -> goto expired
            :: else -> TOUCH(c);
                s_i = 0; s_pred = NONE;
                do
                :: s_i < K && node[s_i] == pseq[c] -> s_pred = s_i + 1; break
                :: s_i < K && node[s_i] != pseq[c] -> s_i++
                :: s_i >= K -> break
                od;
                ANSWERED(c);
                if
                :: s_pred == NONE -> goto relook  /* NoNode: gone already, read the children again */
                :: else -> watch[c] = s_pred; fired[c] = 0
                fi
            fi
        };
        do
        :: atomic { fired[c] ->                 /* the predecessor was deleted */
            fired[c] = 0;
#ifdef MUTANT_PREDECESSOR_GONE_MEANS_HELD
            if :: node[c] != NONE && ALIVE(c) -> below[c] = 0; break :: else -> goto relook fi  /* BUG */
#else
            /* no node is created ahead of an existing one: if it was the only one
               ahead at the last look, ours holds now; else read again */
            if
            :: below[c] == 1 && node[c] != NONE && ALIVE(c) -> below[c] = 0; break
            :: else -> goto relook
            fi
#endif
           }
#ifdef LIVENESS
        :: atomic { watch[c] != NONE ->         /* the connection dropped: the watch is gone, */
            watch[c] = NONE; fired[c] = 0;      /* and the children are read again on reconnect */
#ifdef MUTANT_NO_REREAD_AFTER_RECONNECT
            goto stuck
#else
            goto relook
#endif
           }
#endif
        :: atomic { MORTAL(c) -> if :: ALIVE(c) -> TOUCH(c); cage[c] = 0 :: else -> goto expired fi }  /* a ping */
        :: MAY_CANCEL(c) -> goto cancelled      /* cancelled, or its timeout passed */
        od
    od;
    /* holds: Acquired(czxid, confirmed_at=session.confirmed_at) */
    atomic {
        watch[c] = NONE; fired[c] = 0; pseq[c] = 0;
        tok[c] = czxid[c];
#ifndef LIVENESS
        if
        :: MORTAL(c) -> trust(c, cage[c]);
            if :: dleft[c] == 0 -> goto cancelled :: else -> skip fi  /* too late: given back */
        :: else -> skip
        fi;
        assert(tok[c] > lasttok);               /* property: tokens strictly increase per grant */
        lasttok = tok[c];
#else
        want[c] = 0;
#endif
        inb[c] = 1;
        check()
    };
    do                                          /* the body; the keeper renews (exists: the heartbeat) */
#ifndef LIVENESS
    :: MORTAL(c) && inb[c] && !out[c] -> out[c] = 1
    :: atomic { out[c] ->
        if
        :: ALIVE(c) && node[c] != NONE ->       /* still ours: HoldState._renewed(sent) */
            TOUCH(c);
            if :: inb[c] -> trust(c, age[c]); if :: dleft[c] == 0 -> inb[c] = 0 :: else -> skip fi
               :: else -> skip fi;
            ANSWERED(c)
        :: else -> inb[c] = 0; dleft[c] = 0; out[c] = 0; age[c] = 0   /* expired, or node gone: lost */
        fi;
        check()
       }
#endif
    :: !out[c] -> break
    od;
    atomic { inb[c] = 0; dleft[c] = 0; tok[c] = 0; czxid[c] = 0 };
    atomic { if :: ALIVE(c) && node[c] != NONE -> delete_node(c) :: else -> skip fi; check() };  /* Holds.release */
    goto finish;
cancelled:
    atomic { pend[c] = 1; watch[c] = NONE; fired[c] = 0; pseq[c] = 0; out[c] = 0; age[c] = 0;
             tok[c] = 0; czxid[c] = 0; dleft[c] = 0; below[c] = 0 };
    goto finish;
expired:                                        /* the session expired: its holds are lost (on_expired) */
    atomic { out[c] = 0; age[c] = 0; watch[c] = NONE; fired[c] = 0; known[c] = 0; pseq[c] = 0; czxid[c] = 0;
             sgone[c] = 0; TOUCH(c); cage[c] = 0 };   /* a new session: queue again */
    goto again;
stuck:
    false;                                      /* (MUTANT_NO_REREAD_AFTER_RECONNECT: a watch that is gone) */
finish:
#ifdef LIVENESS
    skip
    od
#else
    finished[c] = 1
#endif
}

/* ---- the Curator client: InterProcessMutex on the same path ---- */
active proctype Curator() {
#ifdef LIVENESS
end_idle:
    do
    :: atomic { want[CURATOR] = 1 };
#endif
    atomic { CREATE(CURATOR) };                 /* create EPHEMERAL_SEQUENTIAL */
clook:
    atomic {                                    /* getChildren, sorted; getData(previous, watcher) */
        look(CURATOR); below[CURATOR] = s_n;
        if :: s_n > 0 -> watch[CURATOR] = s_pred; fired[CURATOR] = 0 :: else -> skip fi
    };
    if
    :: below[CURATOR] > 0 -> atomic { fired[CURATOR] -> fired[CURATOR] = 0; goto clook }  /* notified */
    :: else -> skip
    fi;
    atomic {
        tok[CURATOR] = node[CURATOR];
#ifndef LIVENESS
        assert(tok[CURATOR] > lasttok); lasttok = tok[CURATOR];
#else
        want[CURATOR] = 0;
#endif
        inb[CURATOR] = 1; check() };
    atomic { inb[CURATOR] = 0; tok[CURATOR] = 0; delete_node(CURATOR); check() };  /* release */
#ifdef LIVENESS
    od
#else
    finished[CURATOR] = 1
#endif
}

init {
    atomic {
        sleft[0] = SESSION;
        run Client(0); run Client(1); run Cleaner(0); run Cleaner(1)
    }
}

#ifdef LIVENESS
ltl served { [] (want[0] -> <> inb[0]) }
#endif
