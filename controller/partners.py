"""Pipeline partners: which replica of one stage continues which replica of
the next, from two witnesses, and what the evidence cannot exclude.

Each replica keeps its own pace (stragglers, stalls) in every stage, so
replicas are chained stage by stage by that pace (`chain_replicas`); the
transfers between partners (one side's sends as the other's receives at
the same instants, `transfer_scores`) are the second witness, and alone
decide where the stages reduce within a sample of each other. A partner
is dropped only where the evidence excludes it beyond MISS_Z noise levels:
uncertainty widens the list, never drops a pair. Pure functions of the
arrays controller/skeleton.py prepares (unit-norm residual transfer
series, per-iteration pace).
"""

from __future__ import annotations

from collections import defaultdict
from statistics import NormalDist

import numpy as np

from controller.grouping import max_assignment

CHAIN_SIGNIFICANCE = 1.0  # replicas' assigned pace must beat a chance assignment by this many noise levels
TRANSFER_MARGIN = 0.2  # partners' transfer correlation must beat the rest by this
AMBIGUITY = 1.0  # a chain within this many noise levels of the best is kept too
MISS_Z = 3.0  # a true partner is dropped only beyond this many noise levels (p ~ 0.1 %)
POOLED_SPREAD_ROWS = 8  # rows up to which transfer scores' spread is pooled over all rows
MIN_GAP_SAMPLES = 1.0  # adjacent stages' reductions closer than this many samples: no pace
MIN_TRANSFER_GAP_SAMPLES = 0.5  # ...closer than this: no transfers either, partners unknowable
LAG_ROWS = 64  # rows of a stage boundary that choose its transfers' lag
# Replicas up to which transfers that agree with a pace confirm it only where
# they stand out (they agree with any pace one time in n by chance).
CHANCE_AGREEMENT_ROWS = 8


def _unit_rows(units: list[np.ndarray], wobble: np.ndarray) -> np.ndarray:
    rows = np.stack([wobble[u].mean(axis=0) for u in units])
    rows -= rows.mean(axis=1, keepdims=True)
    return np.asarray(rows / (np.linalg.norm(rows, axis=1, keepdims=True) + 1e-12))


def _members(units: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the units' endpoints concatenated, each one's unit)."""
    return (np.concatenate(units),
            np.repeat(np.arange(len(units)), [len(u) for u in units]))


def _membership(units: list[np.ndarray]) -> np.ndarray:
    """A units x endpoints 0/1 matrix, the endpoints in _members' order."""
    members, unit = _members(units)
    m = np.zeros((len(units), len(members)))
    m[unit, np.arange(len(members))] = 1.0
    return m


def transfer_scores(a_units: list[np.ndarray], b_units: list[np.ndarray], ntx: np.ndarray,
                    nrx: np.ndarray, rail_of: np.ndarray, lag: int = 0,
                    rails: np.ndarray | None = None) -> np.ndarray:
    """How well each unit's sends show as the other's receives at the same
    instants (and back), over their same-rail endpoints: the transfer itself
    between pipeline partners. Rows of ntx/nrx are unit-norm residuals. One
    matrix product per rail over its endpoints, summed per unit pair.
    `lag`: b's samples compared are `lag` samples later than a's; `rails`:
    only these of the rails both sides use."""
    ea, ua = _members(a_units)
    eb, ub = _members(b_units)
    ma = mb = None  # units x members 0/1 matrices, made where needed
    total = np.zeros((len(a_units), len(b_units)))
    count = np.zeros_like(total)
    ra, rb = rail_of[ea], rail_of[eb]
    k = ntx.shape[1]
    sa = slice(max(0, -lag), k - max(0, lag))
    sb = slice(max(0, lag), k - max(0, -lag))
    shared = np.intersect1d(ra, rb)
    for rail in shared if rails is None else np.intersect1d(shared, rails):
        ia, ib = np.flatnonzero(ra == rail), np.flatnonzero(rb == rail)
        x, y = ea[ia], eb[ib]
        score = (ntx[x, sa] @ nrx[y, sb].T + nrx[x, sa] @ ntx[y, sb].T) / 2
        pa, pb = ua[ia], ub[ib]  # members' units, in unit order
        if np.all(np.diff(pa) > 0) and np.all(np.diff(pb) > 0):
            # A unit has one endpoint on this rail (tensor groups span the
            # rails): each unit pair's sum is one score, placed directly
            # (the membership products below give the same values; at
            # 32,768 endpoints they were a third of this function).
            at = np.ix_(pa, pb)
            total[at] += score
            count[at] += 1.0
        else:
            if ma is None or mb is None:
                ma, mb = _membership(a_units), _membership(b_units)
            total += ma[:, ia] @ score @ mb[:, ib].T
            count += np.outer(ma[:, ia].sum(axis=1), mb[:, ib].sum(axis=1))
    return np.asarray(np.where(count > 0, total / np.maximum(count, 1.0), 0.0))


def chain_replicas(stage_units: list[list[np.ndarray]], wobble: np.ndarray,
                   rail_of: np.ndarray, ntx: np.ndarray, nrx: np.ndarray,
                   gaps: list[float] | None = None, max_lag: int = 0
                   ) -> tuple[list[np.ndarray], list[str]]:
    """Pairs of corresponding endpoints in adjacent stages. Replicas are built
    as chains, stage by stage: each next stage's units are assigned to the
    chains whose pace they share (the chain's mean wobble so far, so every
    stage adds evidence). Units only join chains over the same rails. A unit
    whose best chain is not clearly better than another, by the pace of the
    two replicas concerned and by the transfers between the units, keeps
    both (recall first); a stage whose assignment is no better than chance keeps every
    cross pair. `gaps[s - 1]`: how many samples apart stages s - 1 and s
    reduce. Within one sample the pace is an artefact of where the samples
    fall, however confident it looks; the transfers between the two stages
    still have samples of their own while the reductions are half a sample
    apart or more, and alone, against their own noise (`transfer_near`),
    they narrow the partners (bench/partners.py: on the dev set resampled
    to 0.5 s every true partner comes first, at 1 s a fifth do not). Closer
    still, every cross pair is kept. `max_lag`: transfers are also read up
    to this many samples apart (`aligned_transfer_scores`; where they alone
    decide, at every lag within noise of the best, `transfers_alone_near`)."""
    k = wobble.shape[1]
    noise = 1.0 / np.sqrt(max(k, 1))
    chunks: list[np.ndarray] = []
    notes: list[str] = []
    by_rails: dict[tuple[int, ...], list[list[np.ndarray]]] = defaultdict(list)
    for s, units in enumerate(stage_units):
        for u in units:
            key = tuple(sorted(set(rail_of[u].tolist())))
            while len(by_rails[key]) <= s:
                by_rails[key].append([])
            by_rails[key][s].append(u)
    for key, stages in by_rails.items():
        chains = [[u] for u in stages[0]] if stages else []
        for s in range(1, len(stages)):
            prev = [c[-1] for c in chains]
            nxt = stages[s]
            if len(prev) == 1 and len(nxt) == 1:
                # One replica on these rails (one host per stage): its
                # partner is the only one there, however close the stages.
                chunks.extend(_same_rail_cross(prev, nxt, rail_of))
                chains = [chains[0] + [nxt[0]]]
                continue
            if gaps is not None and gaps[s - 1] < MIN_GAP_SAMPLES:
                if gaps[s - 1] >= MIN_TRANSFER_GAP_SAMPLES and len(nxt) == len(prev) \
                        and not _swings_to_the_swap(prev, nxt, ntx, nrx, rail_of):
                    lags, gain = _lag_gains(prev, nxt, ntx, nrx, rail_of, max_lag)
                    near, read = transfers_alone_near(prev, nxt, ntx, nrx, rail_of, lags, gain)
                    chunks.extend(_near_pairs(prev, nxt, near, rail_of))
                    notes.append(f"rails {list(key)}: stages {s - 1}/{s} reduce within one sample "
                                 "of each other, partners by transfers alone (kept "
                                 f"{sum(len(x) - 1 for x in near)} alternative(s)"
                                 f"{_lags_note(read)})")
                else:
                    chunks.extend(_same_rail_cross(prev, nxt, rail_of))
                    why = ("reduce within half a sample of each other"
                           if gaps[s - 1] < MIN_TRANSFER_GAP_SAMPLES else
                           "reduce within one sample of each other and have unequal replicas"
                           if len(nxt) != len(prev) else
                           "reduce within one sample of each other and their transfers "
                           "swing to the other pairing a sample off")
                    notes.append(f"rails {list(key)}: stages {s - 1}/{s} {why}, kept all cross "
                                 "pairs")
                # Nobody knows who continues which chain: start anew.
                chains = [[u] for u in nxt]
                continue
            if not chains or len(nxt) != len(chains):
                chunks.extend(_same_rail_cross(prev, nxt, rail_of))
                notes.append(f"rails {list(key)}: stages {s - 1}/{s} have unequal replicas, "
                             "kept all cross pairs")
                chains = [[u] for u in nxt]  # nobody knows who continues which chain
                continue
            tmpl = _unit_rows([np.concatenate(c) for c in chains], wobble)
            nrows = _unit_rows(nxt, wobble)
            c = tmpl @ nrows.T
            rows, cols = max_assignment(c)
            assigned = c[rows, cols]
            chance = _chance_assignment(tmpl, nrows)
            lags, gain = _lag_gains(prev, nxt, ntx, nrx, rail_of, max_lag)
            t = transfer_scores(prev, nxt, ntx, nrx, rail_of, lags[_best_lag(gain)])
            t_cols = max_assignment(t)[1]
            if len(chains) > 1 and float(np.median(assigned)) < chance + CHAIN_SIGNIFICANCE * noise:
                # The pace is too weak here: try the transfers themselves.
                swing = _swings_to_the_swap(prev, nxt, ntx, nrx, rail_of, t)
                if swing or not _transfers_tell(t, t_cols):
                    chunks.extend(_same_rail_cross(prev, nxt, rail_of))
                    notes.append(f"rails {list(key)}: stages {s - 1}/{s}: neither pace nor "
                                 "transfers tell partners" + (
                                     " (the transfers swing to the other pairing a sample off)"
                                     if swing else "") + ", kept all cross pairs")
                    # Nobody knows who continues which chain: start anew.
                    chains = [[u] for u in nxt]
                    continue
                cols = t_cols
                near, read = transfers_alone_near(prev, nxt, ntx, nrx, rail_of, lags, gain, t)
            else:
                near, read = _pace_near(c, cols, t, t_cols, assigned - chance, noise), 1
            extra = sum(len(x) - 1 for x in near)
            if extra:
                notes.append(f"rails {list(key)}: stages {s - 1}/{s}: kept {extra} alternative "
                             f"partner(s) the evidence could not exclude{_lags_note(read)}")
            chunks.extend(_near_pairs(prev, nxt, near, rail_of))
            if extra:
                # Who continues which chain is in doubt: a guess carried on
                # would lend its pace history to the wrong replica at the
                # next boundary. Start anew from this stage.
                chains = [[u] for u in nxt]
            else:
                chains = [chains[i] + [nxt[j]] for i, j in zip(rows, cols, strict=True)]
    return chunks, notes


def aligned_transfer_scores(a_units: list[np.ndarray], b_units: list[np.ndarray],
                            ntx: np.ndarray, nrx: np.ndarray, rail_of: np.ndarray,
                            max_lag: int = 1) -> np.ndarray:
    """`transfer_scores` at the lag (within +-max_lag samples) where the
    transfers tell partners apart best. The residuals compared are each
    replica's own timing (its stragglers and stalls move all its traffic)
    seen in two different traffic patterns, the sender's and the
    receiver's: they line up where those patterns' pulses do, which need
    not be the same sample. On the dev set, between the two middle stages
    of a 4-stage job at 0.1 s, every true partner scored five noise levels
    below the best other candidate at lag 0 and five above it one sample
    later (bench/partners.py, `aligned`); stages 0/1 and 2/3 peaked at
    lag 0. With two replicas no lag is chosen: their residuals are each
    other's negative, so a lag where partners anti-correlate (the
    correlation swings with the microbatch rhythm) stands out as much as
    the one where they correlate, and reads the swap (dev-sk2 at 0.5 s
    with 10 % of samples missing: the swap 4.3 noise levels ahead). With
    three or more, a partner anti-correlating leaves its row's other
    scores only mildly positive, and the true lag stands out. The lag is
    the one whose rows' best score stands out most from their mean, read
    on at most LAG_ROWS rows (a choice of three, not of partners: the
    matrix at that lag is then scored in full). Past LAG_ROWS rows, on one
    rail: every rail carries the same replicas' traffic, and gathering all
    of the other side's rows on every rail for each lag cost up to a
    second a boundary at 32,768 endpoints."""
    lags, gain = _lag_gains(a_units, b_units, ntx, nrx, rail_of, max_lag)
    return transfer_scores(a_units, b_units, ntx, nrx, rail_of, lags[_best_lag(gain)])


def _swings_to_the_swap(a_units: list[np.ndarray], b_units: list[np.ndarray],
                        ntx: np.ndarray, nrx: np.ndarray, rail_of: np.ndarray,
                        t: np.ndarray | None = None) -> bool:
    """Two replicas: whether their transfers read one sample early or late
    choose the other pairing more strongly than the in-step reading (`t`,
    lag 0) chooses its own. Two replicas' residuals are each other's
    negative and their correlation swings with the microbatch rhythm from
    one sample to the next (`aligned_transfer_scores`), so an in-step
    choice that a neighbouring sample reverses, and more clearly, is no
    evidence of partners: both pairings stay (recall first). dev-sk2 (dp2,
    0.1 s samples) cut to a minute (`bench/variants.py --seconds 60 --skip
    15`, 30 or 45; or 45 s): at one boundary lag 0 chose the swap by 0.24
    while lag +1 chose the truth by 0.42, and that boundary's true partners
    were dropped (recall 0.875); at the boundaries it read right, lag 0 was
    the clearest (0.57 against 0.47 and 0.44 reversed)."""
    if len(a_units) != 2 or len(b_units) != 2:
        return False
    rows = np.arange(2)

    def margin(u: np.ndarray, cols: np.ndarray) -> float:
        return float(np.median(u[rows, cols] - u[rows, 1 - cols]))

    here = t if t is not None else transfer_scores(a_units, b_units, ntx, nrx, rail_of, 0)
    cols = max_assignment(here)[1]
    own = margin(here, cols)
    return any(-margin(transfer_scores(a_units, b_units, ntx, nrx, rail_of, lag), cols) > own
               for lag in (-1, 1))


def _best_lag(gain: np.ndarray) -> int:
    """The lag (row of `_lag_gains`) whose rows stand out most on average."""
    return int(np.argmax(gain.mean(axis=1)))


def _lag_gains(a_units: list[np.ndarray], b_units: list[np.ndarray], ntx: np.ndarray,
               nrx: np.ndarray, rail_of: np.ndarray, max_lag: int
               ) -> tuple[list[int], np.ndarray]:
    """(the lags worth reading, and at each how far each probed row's best
    score stands out from its mean: lags x rows). One lag, 0, where there
    is no choice (`aligned_transfer_scores`)."""
    if max_lag < 1 or min(len(a_units), len(b_units)) < 3:
        return [0], np.zeros((1, 1))
    lags = list(range(-max_lag, max_lag + 1))
    probe = a_units[:: max(1, len(a_units) // LAG_ROWS)][:LAG_ROWS]
    rails = None
    if len(a_units) > LAG_ROWS:
        rails = np.intersect1d(rail_of[np.concatenate(probe)],
                               rail_of[np.concatenate(b_units)])[:1]
    gain = []
    for lag in lags:
        t = transfer_scores(probe, b_units, ntx, nrx, rail_of, lag, rails)
        gain.append(t.max(axis=1) - t.mean(axis=1))
    return lags, np.asarray(gain)


def plausible_lags(gain: np.ndarray) -> np.ndarray:
    """Indices of the lags (rows of `gain`, lags x replica rows) the data
    cannot set aside: the best (largest mean) and every lag whose rows
    stand out less by under AMBIGUITY standard errors of the paired
    difference (the same rows are read at every lag, so their own strength
    cancels): within noise of the best, as for chains. With few replicas
    the best lag is often best by chance: dev-sk1 at 0.25 s with a fifth
    of the samples missing, its first boundary's transfers stood out 0.075
    at one lag and 0.070 at the true one, and the wrong lag's assignment
    was sure of a wrong partner (recall 0.944); dev-sk5 and dev-sk1 at
    0.5 s likewise (0.875, 0.944). A one-sided test at 5 % kept lags far
    more often, and at the dev set's own 2 % of missing samples cost 0.02-0.09
    of precision at 0.25-0.5 s where no pair was being lost."""
    best = _best_lag(gain)
    rows = gain.shape[1]
    if gain.shape[0] == 1 or rows < 2:
        return np.array([best])
    d = gain[best][None, :] - gain
    spread = d.std(axis=1, ddof=1) / np.sqrt(rows)
    worse = d.mean(axis=1)
    # No spread: identical readings are a tie, a uniform loss is decisive.
    tstat = np.where(spread > 0, worse / np.maximum(spread, 1e-12),
                     np.where(worse > 0, np.inf, 0.0))
    tstat[best] = 0.0
    return np.flatnonzero(tstat < AMBIGUITY)


def transfers_alone_near(a_units: list[np.ndarray], b_units: list[np.ndarray],
                         ntx: np.ndarray, nrx: np.ndarray, rail_of: np.ndarray,
                         lags: list[int], gain: np.ndarray, best: np.ndarray | None = None
                         ) -> tuple[list[np.ndarray], int]:
    """Partners by transfers alone (`transfer_near`), read at every lag the
    data cannot set aside (`plausible_lags`), and how many lags that was.
    Which lag carries the transfers is itself an estimate; where it is in
    doubt, what each plausible lag leaves open is kept (recall first).
    `lags`, `gain`: the boundary's `_lag_gains`; `best`: its scores at the
    best lag where the caller has read them already (a full matrix: up to a
    second a boundary at 32,768 endpoints)."""
    keep = plausible_lags(gain)
    near: list[np.ndarray] | None = None
    for i in keep:
        t = (best if best is not None and int(i) == _best_lag(gain) else
             transfer_scores(a_units, b_units, ntx, nrx, rail_of, lags[int(i)]))
        more = transfer_near(t, max_assignment(t)[1])[0]
        near = more if near is None else [np.union1d(x, y)
                                          for x, y in zip(near, more, strict=True)]
    assert near is not None
    return near, len(keep)


def _lags_note(read: int) -> str:
    return f", read at {read} lags: which one carries the transfers is in doubt" if read > 1 else ""


def _transfers_tell(t: np.ndarray, t_cols: np.ndarray) -> bool:
    """Whether the transfers' best assignment is evidence at all: most rows'
    assigned score beats the rest by TRANSFER_MARGIN, or (three rows or
    more) most rows stand out from their own alternatives by the
    Bonferroni-corrected test of `transfer_near`. A fixed margin alone
    missed transfers ten noise levels clear whose correlations ran at
    0.14-0.18 (the level depends on how much else the samples hold), and
    every cross pair was kept (dp32 tp8 pp4 at 0.2 s: precision 0.41)."""
    n = len(t_cols)
    rows = np.arange(n)
    others = (t.sum(axis=1) - t[rows, t_cols]) / max(1, n - 1)
    if float(np.median(t[rows, t_cols] - others)) >= TRANSFER_MARGIN:
        return True
    if n < 3:
        return False
    # The standing-out test of `_transfer_evidence`, without its move
    # losses (a shortest-path pass, cubic in the replicas).
    mine, mu, sd = _row_noise(t, t_cols)
    return float(np.mean((mine - mu) < miss_z(n - 1) * sd)) < 0.5


def _pace_near(c: np.ndarray, cols: np.ndarray, t: np.ndarray, t_cols: np.ndarray,
               strength: np.ndarray, noise: float) -> list[np.ndarray]:
    """Partners the pace (c, assigned cols) and the transfers (t, their own
    best assignment t_cols) leave open. A move's loss carries four scores'
    noise (2 noise units); a true partner lost to noise shows a loss near
    minus the two rows' signals plus noise, so the weaker the pace of the
    two replicas a move involves, the wider it is kept (replicas' paces
    differ: a job-wide median would trust the weak ones as much as the
    strong ones). A row's pace counts as strong only where the transfers
    choose the same partner: a pace can look strong by chance, and a wrong
    assignment is then trusted most where it is wrong. With eight replicas
    or fewer the transfers must also stand out doing so: they agree with
    any pace one time in n by chance, and an expert group's lockstep had
    both witnesses choose the swap of two true partners, the transfers tied
    0.44 / 0.38 (bench/sweep.py --set moe). With more replicas an agreement
    is itself rare by chance, and asking more cost precision at 4,096
    endpoints (0.991 -> 0.985) and kept no pair that was lost.
    The transfers are a second, independent witness: a move the pace cannot
    exclude is kept only if they leave it open too; where they clearly
    choose another partner, or clearly prefer a swap, both choices are kept
    (two witnesses that disagree settle nothing; with two replicas the
    pace's four scores are one number)."""
    n = len(cols)
    t_near, sure = transfer_near(t, t_cols)
    agree = t_cols == cols
    if 3 <= n <= CHANCE_AGREEMENT_ROWS:
        agree &= sure
    strength = np.where(agree, np.maximum(strength, 0.0), 0.0)
    holder = _holders(cols)
    both = strength[:, None] + strength[holder][None, :]
    # A move's four scores carry independent noise (two units) only with
    # three replicas or more: two replicas' paces are each other's negative
    # (each is relative to their stage), so the four are one number and its
    # noise counts four times (dp2 pp8, six 30 s iterations: a chance
    # correlation of 0.79 against weak transfers dropped a boundary).
    units = 2.0 if n > 2 else 4.0
    tolerance = np.maximum(2 * AMBIGUITY * noise, units * miss_z(n - 1) * noise - both)
    near = _near_assignments(c, cols, tolerance)
    if any(len(x) > 1 for x in near):
        near = [np.intersect1d(a, b) for a, b in zip(near, t_near, strict=True)]
    # A pace that is no replica's own says nothing about partners: a row
    # scoring as well (within noise) with another column as with its own
    # follows a rhythm several replicas share (an expert group's all-to-alls
    # hold its replicas in lockstep; which side of a sample boundary each
    # host's clock puts them then splits rows into blocks correlating +-0.8
    # with whole blocks of columns); so is a row whose column another row
    # scores as well on (two replicas of one group both best with one
    # column: dp8 tp4 pp8 ep4 dropped a true pair, recall 0.993). The
    # transfers alone decide such a row, among the columns of its block
    # where the block is square: several expert groups each in lockstep
    # are told apart by their paces, and one group's k replicas hold k rows
    # and k columns (bench/sweep.py --set moe, two groups of four:
    # precision 0.53 -> 0.73). A split by hosts' clocks need not be square
    # (3 rows against 2 columns dropped pairs when every block was
    # trusted: recall 0.97).
    # With two replicas a tie is only a weak pace, which the tolerance above
    # already widens for.
    if n >= 3:
        mine = c[np.arange(n), cols]
        vague = ((c >= (mine - noise)[:, None]).sum(axis=1) > 1) | (
            (c[:, cols] >= (mine - noise)[None, :]).sum(axis=0) > 1)
        if vague.any():
            block = _square_blocks(c >= (mine - np.sqrt(2.0) * miss_z(n - 1) * noise)[:, None])
            near = [np.union1d(np.intersect1d(t_near[i], block[i]), [cols[i]])
                    if vague[i] else x for i, x in enumerate(near)]
    preferred = _preferred_swaps(t, cols, 2 * TRANSFER_MARGIN)
    return [np.union1d(np.union1d(x, p), [cols[i], t_cols[i]] if sure[i] else [cols[i]])
            for i, (x, p) in enumerate(zip(near, preferred, strict=True))]


def _square_blocks(close: np.ndarray) -> list[np.ndarray]:
    """For each row, the columns of its block: rows joined through the
    columns they are close to, and those columns. Partners are one-to-one,
    so a block of k replicas sharing a pace (an expert group in lockstep)
    holds k rows and k columns; a block that does not is no such group (a
    split by hosts' clocks), and its rows get every column."""
    linked = (close.astype(np.float32) @ close.T.astype(np.float32)) > 0
    while True:
        wider = (linked.astype(np.float32) @ linked.astype(np.float32)) > 0
        if (wider == linked).all():
            break
        linked = wider
    everything = np.arange(close.shape[1])
    out = []
    for i in range(close.shape[0]):
        cols = np.flatnonzero(close[linked[i]].any(axis=0))
        out.append(cols if len(cols) == int(linked[i].sum()) else everything)
    return out


def _forced_loss(c: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """loss[i, j]: how much less the best assignment that gives row i
    column j totals than the chosen one. Not only a swap with j's holder:
    the holder may move on to a third column, and so on until a row takes
    row i's old column (a wrong assignment is often a cycle of three or
    four, and the true partner then looks worse by one swap than it is).
    Shortest chains of moves between columns (Floyd-Warshall); `cols`
    must be a best assignment of `c` (else a cycle of moves gains, and
    there is no shortest chain)."""
    n = len(cols)
    holder = _holders(cols)
    mine = c[np.arange(n), cols]
    # move[j, k]: j's holder moves from column j to column k.
    dist = mine[holder][:, None] - c[holder]
    np.fill_diagonal(dist, 0.0)
    for k in range(n):
        np.minimum(dist, dist[:, k:k + 1] + dist[k:k + 1, :], out=dist)
    return np.asarray(mine[:, None] - c + dist[:, cols].T)


def _preferred_swaps(c: np.ndarray, cols: np.ndarray, margin: float) -> list[np.ndarray]:
    """For each row, its assigned column and every column whose swap with
    its holder gains more than `margin`. One swap, not the best chain of
    moves: a chain's gain is the best of many noisy sums, and a witness with
    nothing to say would seem to prefer something."""
    holder = _holders(cols)
    mine = c[np.arange(len(cols)), cols]
    loss = mine[:, None] + mine[holder][None, :] - c - c[holder][:, cols].T
    return [np.flatnonzero(row) for row in loss <= -margin]


def _row_noise(c: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each row's assigned score, the mean and spread of its scores away
    from its assignment); with eight rows or fewer one spread for all."""
    n = len(cols)
    rows = np.arange(n)
    mine = c[rows, cols]
    off = np.where(rows[None, :] == cols[:, None], np.nan, c)
    mu = np.nanmean(off, axis=1)
    sd = np.maximum(np.nanstd(off, axis=1, ddof=1) if n > POOLED_SPREAD_ROWS
                    else np.full(n, float(np.nanstd(off - mu[:, None], ddof=1))), 1e-9)
    return mine, mu, sd


def _transfer_evidence(c: np.ndarray, cols: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Loss of each move (`_forced_loss`), its z-score and the rows whose
    assigned score does not stand out, from transfer scores (at least three
    rows; `cols` their best assignment). Each row's scores away from its
    assignment show its noise; a move's loss carries four scores' noise,
    less the two rows' strength beyond what the best of their noise reaches
    by luck (a true partner the assignment missed shows a loss of at most
    that noise). A row stands out at MISS_Z corrected for
    every alternative it has: with hundreds of replicas some noise score is
    several levels high."""
    n = len(cols)
    holder = _holders(cols)
    mine, mu, sd = _row_noise(c, cols)
    best_by_luck = NormalDist().inv_cdf(1.0 - 1.0 / n)
    strength = np.maximum(mine - mu - best_by_luck * sd, 0.0)
    both = strength[:, None] + strength[holder][None, :]
    spread = np.sqrt(2.0 * (sd[:, None] ** 2 + sd[holder][None, :] ** 2))
    loss = _forced_loss(c, cols)
    return loss, (loss + both) / spread, (mine - mu) < miss_z(n - 1) * sd


def transfer_near(c: np.ndarray, cols: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """For each row, its column in `cols` (the best assignment by these
    transfer scores) and every column they cannot rule out
    (`_transfer_evidence`); and which rows stand out (none when fewer than
    three: no spread to measure, a fixed margin instead). A row whose
    assigned score does not stand out tells nothing: its true partner may be
    any column held by another such row (a column held by a row that does
    stand out is that row's)."""
    n = len(cols)
    if n < 3:
        return _near_assignments(c, cols, 2 * TRANSFER_MARGIN), np.zeros(n, dtype=bool)
    loss, z, unresolved = _transfer_evidence(c, cols)
    # The z-test alone, however few the rows. A fixed margin of 0.4 used to
    # back it up with eight rows or fewer, because on the dev set resampled
    # to 0.25 s a boundary's transfers all pointed wrong (the true partner
    # below the rest) and z alone dropped it; that boundary's transfers
    # were read a sample off (`aligned_transfer_scores`), and at their lag
    # they point right. The margin kept every cross pair of such jobs
    # (transfer correlations of 0.05-0.2): dev copies at 0.25 s 0.912 ->
    # 0.973, at 0.5 s 0.824 -> 0.912, recall 1.0 on every set.
    keep = (loss <= 0.0) | (z <= miss_z(n - 1))
    near = [np.flatnonzero(row) for row in keep]
    if unresolved.sum() > 1:
        free = cols[unresolved]
        near = [np.union1d(x, free) if unresolved[i] else x for i, x in enumerate(near)]
    return near, ~unresolved


def _holders(cols: np.ndarray) -> np.ndarray:
    """holder[j]: the row assigned column j (the inverse permutation)."""
    holder = np.empty_like(cols)
    holder[cols] = np.arange(len(cols))
    return holder


def miss_z(alternatives: int) -> float:
    """MISS_Z for one alternative, Bonferroni-corrected for `alternatives`."""
    p = 1.0 - NormalDist().cdf(MISS_Z)
    return NormalDist().inv_cdf(1.0 - p / max(1, alternatives))


def _chance_assignment(tmpl: np.ndarray, rows: np.ndarray, shifts: int = 5) -> float:
    """The median score a best one-to-one assignment reaches by chance: the
    same rows with their iterations rotated (pace kept, pairing broken).
    The more replicas, the higher the best of them scores by luck."""
    k = rows.shape[1]
    out = []
    for sh in range(1, shifts + 1):
        c = tmpl @ np.roll(rows, sh * k // (shifts + 1), axis=1).T
        r, col = max_assignment(c)
        out.append(float(np.median(c[r, col])))
    return float(np.mean(out))


def _near_assignments(c: np.ndarray, cols: np.ndarray, tolerance: float | np.ndarray
                      ) -> list[np.ndarray]:
    """For each row, its assigned column and every column it could take at a
    loss within `tolerance` (one value, or one per row and column; the loss
    of the best assignment that gives it that column, `_forced_loss`).
    Partners are one-to-one, so a unit that scores well with a column already
    clearly taken is no real alternative: the whole exchange must be close."""
    return [np.flatnonzero(row) for row in _forced_loss(c, cols) <= tolerance]


def _near_pairs(prev: list[np.ndarray], nxt: list[np.ndarray], near: list[np.ndarray],
                rail_of: np.ndarray) -> list[np.ndarray]:
    """Same-rail pairs of each unit of `prev` with the units of `nxt` its
    row of `near` keeps."""
    return [c for i, close in enumerate(near)
            for c in _same_rail_cross([prev[i]], [nxt[x] for x in close], rail_of)]


def _same_rail_cross(a_units: list[np.ndarray], b_units: list[np.ndarray],
                     rail_of: np.ndarray) -> list[np.ndarray]:
    if not a_units or not b_units:
        return []
    ea, eb = np.concatenate(a_units), np.concatenate(b_units)
    ia, ib = np.nonzero(rail_of[ea][:, None] == rail_of[eb][None, :])
    return [np.stack([ea[ia], eb[ib]], axis=1)] if len(ia) else []
