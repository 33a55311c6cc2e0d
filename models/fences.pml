/*
 * The fences: writes through a fence to a store, by holders of one lock that
 * may be paused past their lease, the next holder writing meanwhile.
 *
 * Mirrors, step by step (each step below names its source):
 *   asynclock/fencing.py   FENCED_CALL (RedisFence.call's script: the mark read, a token older than
 *                          it refused with nothing run; else the command, then the mark raised to
 *                          the token; a command that fails raises nothing), PostgresFence.advance
 *                          (INSERT ... ON CONFLICT DO UPDATE ... WHERE f.token <= EXCLUDED.token
 *                          inside the caller's transaction, before its writes: the mark's row stays
 *                          locked until the transaction ends; no row returned: StaleToken, and the
 *                          caller's transaction is rolled back)
 *   asynclock/_lease.py    the lease's fencing token, from the lock's grant (the lock models check
 *                          that tokens strictly increase from grant to grant)
 *
 * Holders: HOLDERS holders of one lock, granted in turn with tokens 1, 2, 3, 4. A
 * holder may be paused past its lease at any time, and the lock then lets the
 * next one in: so each holder writes at any time after its grant, before, during
 * or after the later holders' writes (a holder that knows its lease is lost is
 * refused before any I/O). Each holder makes WRITES writes, each
 * to one of two stores: a Redis store behind a RedisFence (its mark key) or a
 * PostgreSQL table behind a PostgresFence (its high-water row), one resource each.
 *
 * Atomic: a Redis script; a PostgreSQL statement. The PostgreSQL row lock makes a
 * second transaction's advance wait until the first one ends (commit or rollback)
 * and then read the committed mark (READ COMMITTED, as an upsert re-checks its
 * row). A Redis command may fail (a wrong type); a PostgreSQL transaction may be
 * rolled back after its advance (its writes failed).
 *
 * Properties: the tokens of the writes a store applies (a Redis command run, a
 * PostgreSQL transaction committed) never decrease; a write is refused only when
 * the store has seen a newer token (so a holder's writes all apply while no newer
 * token wrote). Bounds: four holders, two writes each. No liveness property (a
 * fence never waits but for a PostgreSQL row lock, whose transaction ends).
 */

#ifndef HOLDERS
#define HOLDERS 4
#endif
#ifndef WRITES
#define WRITES 2
#endif

byte grants;                   /* the lock's grants so far: holder h's token is h + 1 */

/* ---- the Redis store ---- */
byte rmark;                    /* the resource's mark key (0: none yet) */
byte rlast;                    /* the token of the last command the store ran */

/* ---- the PostgreSQL store ---- */
byte pmark;                    /* the mark's row, committed (0: no row yet) */
byte prow;                     /* the transaction whose advance locked the row: holder + 1 (0: none) */
byte ptent;                    /* the mark as that transaction wrote it, not yet committed */
byte plast;                    /* the token of the last transaction committed with its writes */

/* the fence's comparison: the writer's token is fresh if the mark is not newer */
#ifdef MUTANT_NO_FENCE
#define FRESH(mark, t) true                  /* BUG: no comparison at all */
#elif defined(MUTANT_FENCE_LT)
#define FRESH(mark, t) ((mark) < (t))        /* BUG: the holder's own token counts as stale */
#else
#define FRESH(mark, t) ((mark) <= (t))
#endif

/* property: a store applies a write with a token never older than the last it applied */
#define APPLY(last, t) assert((t) >= (last)); last = t

/* property: a write is refused only if the store has seen a newer token */
#define REFUSED(mark, t) assert((mark) > (t))

proctype Holder(byte h) {
    byte t = h + 1, w;
    atomic { grants == h -> grants++ };      /* granted after the holder before (its lease ended) */
    do
    :: w < WRITES ->
        if
        :: grants > t ->                      /* _fenced: the lease already known lost (a later */
            skip                              /* holder was granted): refused before any I/O */
        :: /* RedisFence.call: one script */
#ifdef MUTANT_CHECK_THEN_WRITE
            atomic { if :: !FRESH(rmark, t) -> REFUSED(rmark, t); goto written :: else -> skip fi };
            atomic {                          /* BUG: the mark read, then the command sent apart */
                if
                :: APPLY(rlast, t); rmark = t
                :: skip                       /* the command fails */
                fi
            }
#else
            atomic {
                if
                :: rmark != 0 && !FRESH(rmark, t) -> REFUSED(rmark, t)   /* {0, mark}: StaleToken */
                :: else ->
                    if
                    :: APPLY(rlast, t);       /* the command runs ... */
                        if :: t != rmark -> rmark = t :: else -> skip fi   /* ... then the mark rises */
                    :: skip                   /* the command fails: nothing raised */
                    fi
                fi
            }
#endif
        :: /* PostgresFence.advance, first in the caller's transaction (waits for the row's lock) */
            atomic {
                prow == 0 ->
                if
                :: pmark == 0 || FRESH(pmark, t) ->   /* inserted, or updated: RETURNING a row */
#ifdef MUTANT_ADVANCE_APART
                    pmark = t                 /* BUG: in a transaction of its own, committed now */
#else
                    prow = h + 1; ptent = t   /* the row stays locked until the transaction ends */
#endif
                :: else -> REFUSED(pmark, t); goto written   /* no row: StaleToken, rolled back */
                fi
            };
            /* the caller's writes, then its commit (or a rollback: the mark's rise is undone) */
            atomic {
                if
                :: APPLY(plast, t);
#ifndef MUTANT_ADVANCE_APART
                    pmark = ptent
#endif
                :: skip
                fi;
                prow = 0; ptent = 0
            }
        fi;
written:
        w++
    :: else -> break
    od
}

init {
    byte h;
    atomic {
        do
        :: h < HOLDERS -> run Holder(h); h++
        :: else -> break
        od
    }
}
