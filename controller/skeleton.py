"""Traffic-skeleton inference from NIC byte counters: pure functions of data.

Follows the physics of real training (controller/timing.py says why):
1. Counters -> rates on one time grid (controller/rates.py: resets, gaps,
   unsorted rows, any interval), host clock offsets of tens of ms.
2. Iterations: the job's symmetric (tx ~ rx) collective bursts, cut at each
   iteration's job-wide sync point; none repeating -> the rail-aligned list
   at low confidence (a debug job).
3. Stages: each endpoint's reduction time within the iteration, relative to
   the job: stages reduce one microbatch's backward apart, last stage first,
   far more than clocks disagree. Equal levels of those offsets, each with
   the same share of every rail, are the stages, ordered latest-first. A
   job with no data-parallel collective at all (dp = 1) is read from its
   transfers instead (controller/pipeline_only.py).
4. Data-parallel groups: one stage's endpoints on one rail (a collective's
   members burst together; NCCL keeps it on the rail).
5. Partners in adjacent stages: each replica keeps its own pace (stragglers,
   stalls), shared by all its stages and tensor-parallel ranks; replicas are
   chained stage by stage by that pace, or by the transfers between them
   (controller/partners.py). Where neither can tell, every cross pair is
   kept: uncertainty widens the list, never drops a pair.
6. Tensor parallelism: the endpoints of a container in one stage that move
   as one; dp = N / (tp x pp). Expert groups from the all-to-all pace.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from controller.grouping import (
    average_linkage,
    average_linkage_stack,
    cut,
    cut_stack,
    find_root,
    largest_after,
)
from controller.partners import chain_replicas
from controller.pinglist import id_hash, owner_bits
from controller.pipeline_only import pipeline_chain, uneven_exchange
from controller.rates import Rates
from controller.timing import (
    Iterations,
    activity_wobble,
    collective_mask,
    collective_offsets,
    find_iterations,
    high_passed,
    on_one_clock,
    one_way_outliers,
    reduction_bursts,
    symmetric,
)
from netskel.arrays import pair_order
from netskel.model import pair_key
from netskel.topology import Topology

MIN_REGULARITY = 0.6  # share of iterations near the period for a job to count as training
MIN_STAGE_SEPARATION = 0.7  # silhouette of reduction offsets that makes stages
MAX_STAGES = 64
SIGNIFICANCE = 4.0  # an expert / tensor-parallel split must agree this many noise levels above chance
TP_MAJORITY = 0.75  # share of containers that must split alike to show tensor groups
WIDENED_CONFIDENCE = 0.5  # at most this when some stage boundary kept every cross pair
MIN_SAMPLES_PER_ITERATION = 4  # fewer: a single stage is no surer than WIDENED_CONFIDENCE
MAX_TRANSFER_LAG_S = 0.5  # transfers are compared one sample apart too, where a sample is this or less
# The widest gap between two hosts' clocks (NTP: each within about 25 ms
# of true time). Offsets apart by twice this are not clocks: one endpoint
# per rail reducing that far from the next level is a stage, and members of
# one stage that far apart are no single collective.
CLOCK_SPREAD_S = 0.05
TENSOR_STACK = 256  # containers split together (256 x 8 NICs x 2,400 samples: 16 MB a copy)


@dataclass
class Skeleton:
    job: str
    confidence: float
    dp: int
    tp: int
    pp: int
    ep: int | None
    dp_groups: list[list[str]]
    pp_stages: list[list[str]]
    endpoints: list[str]
    pair_index: np.ndarray  # (P, 2) indices into endpoints, each pair once
    notes: list[str] = field(default_factory=list)
    ep_groups: list[list[str]] = field(default_factory=list)

    @property
    def pairs(self) -> set[tuple[str, str]]:
        """The pairs as sorted id tuples (convenient, not for millions)."""
        e = self.endpoints
        return {pair_key(e[int(a)], e[int(b)]) for a, b in self.pair_index}


def distances(x: np.ndarray) -> np.ndarray:
    """Euclidean distance matrix in one BLAS pass."""
    sq = np.einsum("ij,ij->i", x, x)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    np.maximum(d2, 0.0, out=d2)
    np.fill_diagonal(d2, 0.0)
    return np.asarray(np.sqrt(d2, out=d2))


def silhouette(d: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette from a distance matrix: near 0 for a cut through
    structureless data, near 1 for real groups. Per-cluster distance sums in
    one pass per cut (scikit-learn's silhouette_score is the reference)."""
    n = len(labels)
    g = int(labels.max()) + 1
    if not 1 < g < n:
        return 0.0
    sizes = np.bincount(labels, minlength=g)
    onehot = np.zeros((n, g))
    onehot[np.arange(n), labels] = 1.0
    sums = d @ onehot  # (n, g): each point's distance sum to every cluster
    return _silhouette_from_sums(sums, sizes, labels)


def _silhouette_from_sums(sums: np.ndarray, sizes: np.ndarray, labels: np.ndarray) -> float:
    return float(_silhouettes(sums[None], sizes[None], labels[None])[0])


def _silhouettes(sums: np.ndarray, sizes: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Mean silhouettes of C labellings at once: sums (C, n, g), each
    point's distance sum to every cluster; sizes (C, g); labels (C, n)."""
    rows, n = np.arange(len(labels))[:, None], labels.shape[1]
    own = sizes[rows, labels]
    a = sums[rows, np.arange(n)[None, :], labels] / np.maximum(own - 1, 1)
    mean_other = sums / np.maximum(sizes, 1)[:, None, :]
    mean_other[rows, np.arange(n)[None, :], labels] = np.inf
    b = mean_other.min(axis=2)
    s = (b - a) / np.maximum(np.maximum(a, b), 1e-300)
    s[own == 1] = 0.0
    return np.asarray(s.mean(axis=1))


def silhouette_1d(x: np.ndarray, labels: np.ndarray) -> float:
    """The silhouette of a split of scalars, from sorted prefix sums: no n x n
    matrix, so 32,768 endpoints cost O(n g log n)."""
    g = int(labels.max()) + 1
    if not 1 < g < len(x):
        return 0.0
    sizes = np.bincount(labels, minlength=g)
    sums = np.empty((len(x), g))
    for c in range(g):
        v = np.sort(x[labels == c])
        pre = np.concatenate([[0.0], np.cumsum(v)])
        k = np.searchsorted(v, x, side="right")
        sums[:, c] = x * k - pre[k] + (pre[-1] - pre[k]) - x * (len(v) - k)
    return _silhouette_from_sums(sums, sizes, labels)


def equal_clusters(x: np.ndarray, hosts: list[str], min_separation: float = 0.5
                   ) -> tuple[np.ndarray, float]:
    """Labels of the best split into equal groups of two or more, none holding
    two NICs of one host, and its separation; one group when no split is
    clearly better than chance."""
    n = len(x)
    if n <= 3:
        return np.zeros(n, dtype=np.int64), 1.0
    d = distances(x)
    merges = average_linkage(d)
    codes: dict[str, int] = {}
    host_code = np.array([codes.setdefault(h, len(codes)) for h in hosts], dtype=np.int64)
    n_hosts = len(codes)
    best: tuple[float, np.ndarray | None] = (0.0, None)
    largest = largest_after(merges, n)
    for g in range(2, n // 2 + 1):
        if n % g or largest[n - g] != n // g:
            continue
        labels = cut(merges, n, g)
        sizes = np.bincount(labels, minlength=g)
        if len(sizes) != g or np.any(sizes != n // g):
            continue
        if len(set((labels * n_hosts + host_code).tolist())) != n:  # two NICs of a host together
            continue
        sep = silhouette(d, labels)
        if sep > best[0]:
            best = (sep, labels)
    if best[1] is None or best[0] < min_separation:
        return np.zeros(n, dtype=np.int64), 1.0
    return best[1].astype(np.int64), best[0]


def equal_clusters_stack(x: np.ndarray, min_separation: float = 0.5
                         ) -> tuple[np.ndarray, np.ndarray]:
    """equal_clusters of many small sets of points at once, each point its
    own host: x (C, n, dim) -> labels (C, n) and separations (C,). The same
    steps in one numpy pass per step across all C (at 32,768 endpoints:
    4,096 containers of 8, where equal_clusters' fixed per-call cost was
    most of the tensor split's time)."""
    c, n = x.shape[0], x.shape[1]
    labels = np.zeros((c, n), dtype=np.int64)
    sep = np.ones(c)
    if n <= 3 or not c:
        return labels, sep
    sq = np.einsum("cij,cij->ci", x, x)
    d = sq[:, :, None] + sq[:, None, :] - 2.0 * (x @ x.transpose(0, 2, 1))
    np.maximum(d, 0.0, out=d)
    d[:, np.arange(n), np.arange(n)] = 0.0
    np.sqrt(d, out=d)
    merges = average_linkage_stack(d)
    best = np.zeros(c)
    found = np.zeros(c, dtype=bool)
    for g in range(2, n // 2 + 1):
        if n % g:
            continue
        lab = cut_stack(merges, n, g)
        onehot = (lab[:, :, None] == np.arange(g)[None, None, :]).astype(np.float64)
        sizes = onehot.sum(axis=1)  # (C, g)
        equal = (sizes == n // g).all(axis=1)
        s_mean = _silhouettes(d @ onehot, sizes, lab)
        better = equal & (s_mean > best)
        best[better] = s_mean[better]
        labels[better] = lab[better]
        found |= better
    keep = found & (best >= min_separation)
    labels[~keep] = 0
    sep[keep] = best[keep]
    return labels, sep


@dataclass(frozen=True)
class StageSplit:
    labels: np.ndarray  # stage per endpoint, 0 = first stage
    separation: float  # silhouette of the chosen split (pp > 1)
    best_other: float  # silhouette of the best split not taken


def split_stages(offset: np.ndarray, rail_of: np.ndarray) -> StageSplit:
    """Pipeline stages as levels of the reduction offsets: on every rail its
    endpoints cut into equal groups of consecutive offsets (a stage holds the
    same number of endpoints of every rail, and each rail's stages are its
    own collectives, so noise on one rail never reorders another's); the
    count with the clearest separation wins, and none (pp = 1) unless it is
    clear. The latest reduction is stage 0 (the last stage's backward ends
    first, so it reduces first).
    Levels closer than the clocks' spread are no stages whatever they hold:
    host clocks alone put hosts that many ms apart, and a few hosts whose
    clocks happen to agree form a level of their own (a pure data-parallel
    job split in two by its hosts' clocks). A stage holds two or more
    endpoints per rail (a collective) unless its levels are further apart
    than twice that: one endpoint per rail apart from the rest is otherwise
    a host's clock offset. With one host per stage (tp x dp = a host's GPUs:
    the DP reduction stays inside the host) that is all a stage has, and
    merging two stages into one would pair endpoints that never talk and
    miss the pairs that do."""
    n = len(offset)
    rails, rail_code = np.unique(rail_of, return_inverse=True)
    per_rail = np.bincount(rail_code)
    # Rank of each endpoint within its rail, latest reduction first.
    order = np.lexsort((-offset, rail_code))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - np.repeat(np.r_[0, np.cumsum(per_rail)[:-1]], per_rail)
    best: tuple[float, np.ndarray | None] = (0.0, None)
    other = 0.0
    for g in range(2, min(MAX_STAGES, n // 2) + 1):
        if np.any(per_rail % g):
            continue
        labels = rank // (per_rail // g)[rail_code]
        sep = silhouette_1d(offset, labels)
        closest = _closest_levels(offset, labels)
        if closest <= CLOCK_SPREAD_S or (np.any(per_rail // g < 2)
                                         and closest <= 2 * CLOCK_SPREAD_S):
            # Clocks could make these levels, or stages that close could:
            # not taken, but a single stage is then no surer than the split.
            other = max(other, sep)
            continue
        if sep > best[0]:
            if best[1] is not None:
                other = max(other, best[0])
            best = (sep, labels)
        else:
            other = max(other, sep)
    if best[1] is None or best[0] < MIN_STAGE_SEPARATION:
        return StageSplit(np.zeros(n, dtype=np.int64), 0.0, max(other, best[0]))
    return StageSplit(best[1], best[0], other)


def _scattered_stages(offset: np.ndarray, stage: np.ndarray, dt: float, iterations: int
                      ) -> list[int]:
    """Stages whose endpoints' reduction offsets spread beyond one
    collective's: a member further from the stage's median than twice the
    clock spread plus three standard errors of the sampling (offsets are
    quantized to dt, averaged over the iterations)."""
    tolerance = 2 * CLOCK_SPREAD_S + 3 * dt / np.sqrt(12 * max(iterations, 1))
    out = []
    for k in range(int(stage.max()) + 1):
        x = offset[stage == k]
        if float(np.max(np.abs(x - np.median(x)))) > tolerance:
            out.append(k)
    return out


def _closest_levels(offset: np.ndarray, labels: np.ndarray) -> float:
    """The smallest gap between adjacent levels' medians."""
    med = np.sort([float(np.median(offset[labels == k])) for k in range(int(labels.max()) + 1)])
    return float(np.min(np.diff(med))) if len(med) > 1 else float("inf")


def mend_split_containers(stage: np.ndarray, container_of: np.ndarray, rail_of: np.ndarray
                          ) -> tuple[np.ndarray, int]:
    """(stages, endpoints moved). A container's endpoints in one stage make
    up whole tensor groups, so its stages hold equal shares of it (one
    stage; or, where pipeline ranks are inner, equal blocks). A container
    with most of its endpoints in one stage and the rest elsewhere was cut
    by noise: stages a sample or less apart, whose offsets a few missing
    samples move (dev-sk1 at 1 s with 5 % of the samples dropped: one
    container's rail-0 endpoint and another's traded stages, and recall fell
    to 0.86). Such endpoints trade back, two at a time on one rail, each to
    the stage its container's majority holds: every rail keeps its share of
    every stage. One with no such counterpart stays where it is."""
    stage = stage.copy()
    # Endpoints per (container, stage) in one bincount: no pass per container.
    pp, containers = int(stage.max()) + 1, int(container_of.max()) + 1
    counts = np.bincount(container_of * pp + stage,
                         minlength=containers * pp).reshape(containers, pp)
    top = counts.argmax(axis=1)
    cut = ((2 * counts[np.arange(containers), top] > counts.sum(axis=1))
           & (np.count_nonzero(counts, axis=1) > 1))
    # The container's stage, for members of a container cut by noise.
    home = np.where(cut[container_of], top[container_of], -1)
    stray = np.flatnonzero((home >= 0) & (home != stage))
    moved = 0
    waiting: dict[tuple[int, int, int], list[int]] = defaultdict(list)  # (rail, from, to)
    for i in stray.tolist():
        r, a, b = int(rail_of[i]), int(stage[i]), int(home[i])
        if waiting[(r, b, a)]:
            j = waiting[(r, b, a)].pop(0)
            stage[i], stage[j] = b, a
            moved += 2
        else:
            waiting[(r, a, b)].append(i)
    return stage, moved


def tensor_units(members: list[np.ndarray], fine: np.ndarray) -> list[np.ndarray]:
    """Each container's endpoints in one stage, split into the tensor-parallel
    groups they hold. A TP group's ranks send their shards of every
    activation at the same instants, so their fine-grained (high-passed)
    traffic correlates; a container holding two replicas (tp4 on an 8-NIC
    host) falls into two equal blocks. The split must be the same in most
    containers of the job: a chance split in a few is noise."""
    splits: list[np.ndarray | None] = [None] * len(members)
    # Containers of one size are split together (equal_clusters_stack).
    by_size: dict[int, list[int]] = defaultdict(list)
    for k, m in enumerate(members):
        if len(m) >= 4:
            by_size[len(m)].append(k)
    for ks in by_size.values():
        for lo in range(0, len(ks), TENSOR_STACK):
            part = ks[lo:lo + TENSOR_STACK]
            y = fine[np.stack([members[k] for k in part])]
            y -= y.mean(axis=2, keepdims=True)
            y /= np.linalg.norm(y, axis=2, keepdims=True) + 1e-12
            labels, _seps = equal_clusters_stack(y, min_separation=0.0)
            for k, one in zip(part, labels, strict=True):
                splits[k] = one if one.max() > 0 else None
    counts = [int(lab.max()) + 1 if lab is not None else 1 for lab in splits]
    g = max(set(counts), key=counts.count)
    if g == 1 or counts.count(g) < TP_MAJORITY * len(counts):
        return list(members)
    out: list[np.ndarray] = []
    for m, lab in zip(members, splits, strict=True):
        if lab is None or int(lab.max()) + 1 != g:
            out.append(m)
        else:
            out.extend(m[lab == c] for c in range(g))
    return out


def _container_residuals(containers: np.ndarray, fine: np.ndarray) -> np.ndarray:
    """(C, k, k) for containers (C, k) of k endpoints each: correlations of
    a container's endpoints after what the whole container does is removed
    (each replica it holds then shows as a block correlating within,
    anti-correlating across). TENSOR_STACK containers a pass."""
    out = np.empty((len(containers), containers.shape[1], containers.shape[1]))
    for lo in range(0, len(containers), TENSOR_STACK):
        x = fine[containers[lo:lo + TENSOR_STACK]]
        y = x - x.mean(axis=1, keepdims=True)
        y -= y.mean(axis=2, keepdims=True)
        y /= np.linalg.norm(y, axis=2, keepdims=True) + 1e-12
        out[lo:lo + TENSOR_STACK] = y @ y.transpose(0, 2, 1)
    return out


def rail_tensor_split(containers: list[np.ndarray], fine: np.ndarray, rail_of: np.ndarray
                      ) -> np.ndarray | None:
    """Tensor groups read from every container at once: a label per rail,
    or None. Megatron lays tensor groups out alike on every host (local
    ranks 0-3 and 4-7 for tp4 on 8 GPUs), so the rails of one group are the
    same in each container, and each rail pair's correlation (container
    residuals) can be averaged over all of them. At 0.5 s sampling one
    container's eight series are too short to split (dev tp4 resampled:
    4 of 8 containers split right, so tp read 8), the average over 16 is
    not. A chance split fits what chose it: the containers are halved
    (alternately), each half chooses a split of the rails on its own, and
    the two must agree (on the dev set's tp8 jobs the halves' chance splits
    never did), and the split must hold container by container (its
    within-minus-across correlation SIGNIFICANCE standard errors above
    zero). Containers must all hold the same four rails or more, and the
    groups must be runs of consecutive rails (local ranks): a simulated
    dp2 tp8 pp4 job read tp4 at confidence 0.99 from rails {0, 2, 4, 5}
    against {1, 3, 6, 7}, a split both halves happened to agree on."""
    if len(containers) < 4 or any(len(m) < 4 for m in containers):
        return None
    rails = np.sort(rail_of[containers[0]])
    if len(np.unique(rails)) != len(rails) or any(
            not np.array_equal(np.sort(rail_of[m]), rails) for m in containers):
        return None
    k = len(rails)
    per = list(zip((np.searchsorted(rails, rail_of[m]) for m in containers),
                   _container_residuals(np.stack(containers), fine), strict=True))
    splits = []
    for half in (per[0::2], per[1::2]):
        total = np.zeros((k, k))
        for at, c in half:
            total[np.ix_(at, at)] += c
        labels, _ = equal_clusters(total / len(half), [str(i) for i in range(k)], 0.0)
        if labels.max() == 0:
            return None
        splits.append(labels)
    a, b = splits  # the same partition, whatever the label numbers
    if not np.array_equal(a[:, None] == a[None, :], b[:, None] == b[None, :]):
        return None
    labels = splits[0]
    if np.count_nonzero(np.diff(labels)) != int(labels.max()):
        return None  # not consecutive local ranks: no layout Megatron makes
    d = []
    for at, c in per:
        lab = labels[at]
        same = lab[:, None] == lab[None, :]
        np.fill_diagonal(same, False)
        d.append(float(c[same].mean() - c[lab[:, None] != lab[None, :]].mean()))
    dv = np.asarray(d)
    if float(dv.mean()) < SIGNIFICANCE * float(dv.std(ddof=1)) / np.sqrt(len(dv)):
        return None
    out = np.full(int(rail_of.max()) + 1, -1, dtype=np.int64)
    out[rails] = labels
    return out


def replica_signal(containers: list[np.ndarray], fine: np.ndarray, groups: list[np.ndarray],
                   most: int = 256) -> float | None:
    """How much a container's endpoints share beyond their groups' common
    rhythm: the median over containers (at most `most`) of the mean
    correlation between a container's endpoints' residuals (None where no
    container has two endpoints in groups of two or more: no residual to
    compare). One replica's endpoints share its own stalls and stragglers;
    two replicas in one container differ by theirs. Where even the shared
    part is within noise, two replicas in a container could not be told
    from one. (Not in standard errors over containers: dev tp4 at 0.25 s
    with a fifth of its samples missing shares 0.031, consistently enough
    to stand out over 16 containers, yet shows no split.)"""
    group_of = np.empty(len(fine), dtype=np.int64)
    size = np.array([len(g) for g in groups])
    for g, members in enumerate(groups):
        group_of[members] = g
    means = np.stack([fine[g].mean(axis=0) for g in groups])
    out = []
    for m in containers[:: max(1, len(containers) // most)][:most]:
        m = m[size[group_of[m]] >= 2]
        if len(m) < 2:
            continue
        y = fine[m] - means[group_of[m]]
        y /= np.linalg.norm(y, axis=1, keepdims=True) + 1e-12
        total = y.sum(axis=0)
        out.append((float(total @ total) - len(m)) / (len(m) * (len(m) - 1)))
    return float(np.median(out)) if out else None


def replica_pace(tx: np.ndarray, rx: np.ndarray, mask: np.ndarray, it: Iterations, dt: float,
                 stage_sets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(each endpoint's pace per iteration, `activity_wobble`; the samples
    left out of it, `one_way_outliers`). Random one-way bursts and
    checkpoint writes (hundreds of MB, at moments of their own) outweigh an
    iteration's activations: one in an iteration dragged the centre of
    traffic wherever it fell, and true partners' paces correlated at about
    0.05 (4,096 endpoints, 5-minute recordings: the pace chose 28-55 % of
    the partners right, pair precision 0.81-0.93; without the bursts 80-100 %
    and 0.99)."""
    lone = one_way_outliers(tx, rx, mask)
    return activity_wobble(np.where(lone, 0.0, tx + rx), mask, it, dt, stage_sets), lone


def transfer_series(tx: np.ndarray, rx: np.ndarray, mask: np.ndarray, lone: np.ndarray,
                    dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sent, received, their sum): traffic outside collectives (`mask`),
    high-passed. The sum, for the tensor split, keeps every sample; sent and
    received, the transfer evidence, leave out each endpoint's largest
    one-way samples (`lone`, `one_way_outliers`): random one-way bursts and
    checkpoint writes (hundreds of MB, one direction, partner of nobody)
    outweigh every activation in a correlation. High-passing is linear in
    the bytes, so the sum is the high-passed sum."""
    with ThreadPoolExecutor(2) as pool:  # numpy passes that release the GIL: both cores
        htx, hrx = pool.map(lambda x: high_passed(x, mask, dt), (tx, rx))
    fine = htx + hrx
    htx[lone] = 0.0
    hrx[lone] = 0.0
    return htx, hrx, fine


def _group_residual(x: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """Each row minus its group's mean row, scaled to unit norm: what the
    group's members share (the iteration's common rhythm) removed."""
    out = np.empty_like(x)
    for g in groups:
        rows = x[g]  # gathered once
        out[g] = rows - rows.mean(axis=0, keepdims=True)
    out /= np.sqrt(np.einsum("ij,ij->i", out, out))[:, None] + 1e-12
    return out


def infer(topo: Topology, job: str, r: Rates) -> Skeleton:
    eps = r.endpoints
    n = len(eps)
    nic = [topo.nics[topo.endpoints[e].nic] for e in eps]
    rail_of = np.array([x.rail for x in nic])
    host_codes = {h: k for k, h in enumerate(sorted({x.host for x in nic}))}
    host_of = np.array([host_codes[x.host] for x in nic])
    # float32 rates (7 digits are plenty for shapes and timing) halve the
    # memory every (endpoints x samples) pass moves.
    tx, rx = r.tx.astype(np.float32, copy=False), r.rx.astype(np.float32, copy=False)
    sym = symmetric(tx, rx)
    burst = reduction_bursts(sym)
    it = find_iterations(burst, r.dt)
    if it is None or it.regularity < MIN_REGULARITY:
        why = ("no repeating collective bursts" if it is None else
               f"irregular iterations (regularity {it.regularity:.2f})")
        return rail_aligned(topo, job, eps, f"no periodic training traffic: {why}")
    offset = collective_offsets(burst, it, r.dt)
    del burst
    if not np.all(np.isfinite(offset)):
        missing = int(np.sum(~np.isfinite(offset)))
        pure = pure_pipeline(job, eps, tx, rx, rail_of, host_of, it, r.dt)
        return pure or rail_aligned(topo, job, eps, f"{missing} endpoint(s) take no part in the "
                                    "job's collectives")
    split = split_stages(offset, rail_of)
    if int(split.labels.max()) == 0 and _scattered_stages(offset, split.labels, r.dt, it.count):
        # One "stage" that is no single collective: perhaps no collective at
        # all, a pipeline without data parallelism.
        pure = pure_pipeline(job, eps, tx, rx, rail_of, host_of, it, r.dt)
        if pure is not None:
            return pure
    elif int(split.labels.max()) == 0 and int(host_of.max()) == 1:
        # Two hosts: their exchange looks like a collective of two whether
        # it is an all-reduce or a two-stage pipeline's sends and receives.
        # Only 1F1B's shape tells: a pipeline's first stage receives well
        # after it sends, an all-reduce sends and receives at once (real
        # gloo jobs: +0.14 / -0.20 s for pp2 x dp1, +0.001 / +0.002 s for
        # dp2, read as dp2 at confidence 1.0 before).
        pure = pure_pipeline(job, eps, tx, rx, rail_of, host_of, it, r.dt)
        if pure is not None and pure.confidence > WIDENED_CONFIDENCE:
            return pure
    stage = split.labels
    pp = int(stage.max()) + 1
    cont_of = {e: topo.endpoints[e].container for e in eps}
    container_codes = {c: k for k, c in enumerate(sorted(set(cont_of.values())))}
    container_of = np.array([container_codes[cont_of[e]] for e in eps])
    stage, mended = mend_split_containers(stage, container_of, rail_of)
    # Network data-parallel groups: one stage's endpoints on one rail.
    group_key = stage * (int(rail_of.max()) + 1) + rail_of
    _, group_of = np.unique(group_key, return_inverse=True)
    groups = [np.flatnonzero(group_of == g) for g in range(int(group_of.max()) + 1)]
    chunks: list[np.ndarray] = []
    for g in groups:
        ia, ib = np.triu_indices(len(g), k=1)
        chunks.append(np.stack([g[ia], g[ib]], axis=1))
    # Everything after the stages compares endpoints sample by sample:
    # on one clock, a send and its receive share a sample.
    tx, rx = on_one_clock(tx, rx, offset, groups, host_of, r.dt, CLOCK_SPREAD_S)
    sym = symmetric(tx, rx)
    mask = collective_mask(sym, groups)
    stage_sets = [np.flatnonzero(stage == s) for s in range(pp)]
    wobble, lone = replica_pace(tx, rx, mask, it, r.dt, stage_sets)
    htx, hrx, fine = transfer_series(tx, rx, mask, lone, r.dt)
    del lone
    # Replica units: a container's endpoints within one stage, split where
    # they serve several replicas.
    stage_units: list[list[np.ndarray]] = []
    whole_containers: list[list[np.ndarray]] = []
    for s in range(pp):
        by_cont: dict[str, list[int]] = defaultdict(list)
        for i in stage_sets[s]:
            by_cont[cont_of[eps[int(i)]]].append(int(i))
        conts = [np.asarray(m) for m in by_cont.values()]
        stage_units.append(tensor_units(conts, fine))
        whole_containers.append(conts)
    # Tensor groups are the same in every stage; if their rail sets differ a
    # split was chance, and whole containers are the units.
    keys = [sorted(tuple(sorted(set(rail_of[u].tolist()))) for u in us) for us in stage_units]
    split_alone = all(len(us) > len(cs) for us, cs in zip(stage_units, whole_containers,
                                                           strict=True))
    containers = [m for cs in whole_containers for m in cs]
    if any(k != keys[0] for k in keys) or not split_alone:
        stage_units = whole_containers
        # No split held in every stage: perhaps all containers together show one.
        by_rail = rail_tensor_split(containers, fine, rail_of)
        if by_rail is not None:
            stage_units = [[m[by_rail[rail_of[m]] == g] for m in us
                            for g in np.unique(by_rail[rail_of[m]])] for us in whole_containers]
    sizes = [len(u) for us in stage_units for u in us]
    tp = max(set(sizes), key=sizes.count) if sizes else 1
    notes: list[str] = []
    widened = False
    sym_wobble = activity_wobble(sym, mask, it, r.dt, groups)
    ep, ep_groups = expert_groups(sym_wobble, groups)
    if pp > 1:
        with ThreadPoolExecutor(2) as pool:  # both cores, as transfer_series
            ntx, nrx = pool.map(lambda v: _group_residual(v, groups), (htx, hrx))
        level = [float(np.median(offset[st])) for st in stage_sets]
        gaps = [abs(b - a) / r.dt for a, b in zip(level, level[1:], strict=False)]
        merged = expert_units(stage_units, ep_groups, n)
        if merged is not None:
            # An expert group's replicas wait for each other at every
            # all-to-all: their pace is one, and so is the timing of their
            # transfers. Whole groups are chained (their pace averaged over
            # all members), and within a matched pair of groups every cross
            # pair is kept.
            notes.append(f"expert groups of {ep}: partners chained group by group, every "
                         "cross pair within matched groups kept")
            widened = True
        more, chain_notes = chain_replicas(merged or stage_units, wobble, rail_of, ntx, nrx,
                                           gaps, max_lag=int(r.dt <= MAX_TRANSFER_LAG_S))
        chunks.extend(more)
        notes.extend(chain_notes)
        widened = widened or bool(chain_notes)  # each note: a boundary whose partners stayed open
    if n % (tp * pp):
        notes.append(f"{n} endpoints do not divide into tp={tp} x pp={pp}")
    dp = max(1, n // (tp * pp))
    # Honest confidence: iterations must repeat, and the stage structure must
    # be clear. A single stage is only as credible as no split is visible.
    quality = split.separation if pp > 1 else max(0.0, 1.0 - split.best_other)
    confidence = float(np.sqrt(it.regularity * quality))
    scattered = _scattered_stages(offset, stage, r.dt, it.count)
    if scattered:
        # A stage is one collective: members that reduce apart contradict it
        # (a job without data parallelism has no collective to align on).
        notes.append(f"stage(s) {scattered}: endpoints reduce further apart than clocks and "
                     "sampling allow, so they are no single collective: structure in doubt")
        confidence = min(confidence, WIDENED_CONFIDENCE)
    if pp == 1 and not scattered:
        # One collective: every member bursts with every other at once. Host
        # pairs of which one exchanges clearly less than another are no
        # such thing (a pure pipeline at samples too coarse to chain it).
        t = uneven_exchange(tx, rx, rail_of, host_of, it, r.dt, CLOCK_SPREAD_S)
        if t is not None and t >= SIGNIFICANCE:
            notes.append(f"one stage, yet some hosts exchange far less than others (t = {t:.1f}): "
                         "no single collective, structure in doubt")
            confidence = min(confidence, WIDENED_CONFIDENCE)
    if pp == 1 and it.period < MIN_SAMPLES_PER_ITERATION * r.dt:
        # Stages reduce one microbatch's backward apart, a small part of the
        # iteration: with a handful of samples per iteration no split could
        # show, so seeing none is no evidence of a single stage.
        notes.append(f"one stage seen at {it.period / r.dt:.1f} samples an iteration, where "
                     "stages could not show")
        confidence = min(confidence, WIDENED_CONFIDENCE)
    if stage_units is whole_containers and max(map(len, containers), default=0) >= 4:
        # No container splits into tensor groups: one replica each, or two
        # whose difference the sampling hides? A replica's endpoints share
        # its own timing; where even that is below noise, no split could
        # show (dev tp4 at 0.25 s with a fifth of the samples missing read
        # tp8 at confidence 0.97; a pure-DP job has no transfers to show it).
        shared = replica_signal(containers, fine, groups)
        noise = 1.0 / np.sqrt(fine.shape[1])  # how unrelated series of this length correlate
        if shared is not None and shared < SIGNIFICANCE * noise:
            notes.append(f"tensor groups: a container's endpoints share {shared:.3f} of their "
                         f"own timing, under {SIGNIFICANCE:g} noise levels ({noise:.3f}): "
                         "several replicas in one container could not show, tp not vouched for")
            confidence = min(confidence, WIDENED_CONFIDENCE)
    if mended:
        # The offsets alone had cut containers: the stages are a repair, not
        # a reading.
        notes.append(f"{mended} endpoint(s) moved back to their containers' stages (the "
                     "offsets had cut containers apart): structure in doubt")
        confidence = min(confidence, WIDENED_CONFIDENCE)
    if widened:
        # Partners unknown somewhere: the list is knowingly wider than the
        # skeleton (and a tensor split the sampling could not see may be
        # missing too), so the structure is not vouched for.
        confidence = min(confidence, WIDENED_CONFIDENCE)
    dp_groups = sorted(sorted(eps[i] for i in g) for g in groups)
    return Skeleton(job=job, confidence=round(min(1.0, max(0.0, confidence)), 3), dp=dp,
                    tp=tp, pp=pp, ep=ep, dp_groups=dp_groups,
                    ep_groups=sorted(sorted(eps[i] for i in g) for g in ep_groups),
                    pp_stages=[sorted(eps[i] for i in st) for st in stage_sets],
                    endpoints=list(eps), pair_index=_network_pairs(chunks, host_of),
                    notes=notes + [f"period {it.period:.2f} s over {it.count} iterations"])


def pure_pipeline(job: str, eps: list[str], tx: np.ndarray, rx: np.ndarray, rail_of: np.ndarray,
                  host_of: np.ndarray, it: Iterations, dt: float) -> Skeleton | None:
    """A job with no data-parallel collective as a pure pipeline
    (controller/pipeline_only.py), or None where its transfers make none."""
    chain = pipeline_chain(tx, rx, rail_of, host_of, it, dt, CLOCK_SPREAD_S)
    if chain is None:
        return None
    st = chain.stages
    chunks = [np.stack([a, b], axis=1) for a, b in zip(st, st[1:], strict=False)]
    confidence = float(np.sqrt(it.regularity * chain.separation))
    if not chain.oriented:
        confidence = min(confidence, WIDENED_CONFIDENCE)
    return Skeleton(job=job, confidence=round(confidence, 3), dp=1, tp=len(st[0]), pp=len(st),
                    ep=1, dp_groups=sorted([eps[int(i)]] for i in np.concatenate(st)),
                    pp_stages=[sorted(eps[int(i)] for i in s) for s in st], endpoints=list(eps),
                    pair_index=_network_pairs(chunks, host_of),
                    notes=chain.notes + [f"period {it.period:.2f} s over {it.count} iterations"])


def expert_split(seq: np.ndarray) -> np.ndarray | None:
    """Labels of endpoints by the group whose pace they share, or None. Members
    of an expert group (or of one tensor-parallel group) meet in every
    collective, so their per-iteration timing wobbles together; the split
    must be equal and its within-group agreement well above chance
    (correlations of K unrelated wobbles scatter by 1/sqrt(K)). That test
    alone decides: a silhouette of 0.25 was asked as well, and rejected the
    real gloo MoE job's stage 0 (tests/data/gloo-pp2dp4ep2: its expert
    groups 4.3 noise levels clear over 24 iterations, silhouette 0.20; a
    short noisy series keeps silhouettes low however clear the split), so
    ep read 1. Without it none of 76 jobs without experts (dev set, real
    gloo jobs, our default sweep) reads ep > 1, and two more of 55 MoE
    jobs read their ep (the real one and one of our simulator's)."""
    m, k = seq.shape
    if m < 4 or k < 3:
        return None
    x = seq - seq.mean(axis=1, keepdims=True)
    x = x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12)
    labels, _ = equal_clusters(x, [str(i) for i in range(m)], min_separation=0.0)
    g = int(labels.max()) + 1
    if g == 1:
        return None
    c = x @ x.T
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(m, dtype=bool)
    within, between = c[same & off], c[~same]
    noise = 1.0 / np.sqrt(k)
    stderr = noise * np.sqrt(1.0 / len(within) + 1.0 / len(between))
    if float(within.mean() - between.mean()) < SIGNIFICANCE * max(stderr, noise / 2):
        return None
    return labels


def expert_groups(wobble: np.ndarray, dp_groups: list[np.ndarray]
                  ) -> tuple[int, list[np.ndarray]]:
    """(ep, expert groups as endpoint indices) from the all-to-all pace
    inside each data-parallel group; ep 1 and no groups when none shows."""
    found: list[np.ndarray] = []
    sizes: list[int] = []
    for members in dp_groups:
        if len(members) < 4:
            continue
        labels = expert_split(wobble[members])
        if labels is None:
            sizes.append(1)
            continue
        g = int(labels.max()) + 1
        sizes.append(len(members) // g)
        found += [members[labels == c] for c in range(g)]
    ep = max(set(sizes), key=sizes.count) if sizes else 1
    return ep, [f for f in found if len(f) == ep] if ep > 1 else []


def expert_units(stage_units: list[list[np.ndarray]], ep_groups: list[np.ndarray], n: int
                 ) -> list[list[np.ndarray]] | None:
    """Each stage's replica units merged by expert group (units that share
    an expert group on any rail: groups show on some rails and not others),
    or None unless every unit is in one and every stage falls into two or
    more merged units of equal size."""
    if not ep_groups:
        return None
    label = np.full(n, -1, dtype=np.int64)
    for g, members in enumerate(ep_groups):
        label[members] = g
    out = []
    for units in stage_units:
        parent = list(range(len(units)))
        owner: dict[int, int] = {}
        for i, u in enumerate(units):
            seen = [g for g in np.unique(label[u]).tolist() if g >= 0]
            if not seen:
                return None
            for g in seen:
                if g in owner:
                    parent[find_root(parent, i)] = find_root(parent, owner[g])
                else:
                    owner[g] = i
        merged: dict[int, list[np.ndarray]] = defaultdict(list)
        for i, u in enumerate(units):
            merged[find_root(parent, i)].append(u)
        if len(merged) < 2 or len({len(v) for v in merged.values()}) != 1:
            return None
        out.append([np.concatenate(v) for v in merged.values()])
    return out


def _network_pairs(chunks: list[np.ndarray], host_of: np.ndarray) -> np.ndarray:
    """Unique unordered pairs that cross hosts (same-host traffic stays on NVLink)."""
    if not chunks:
        return np.zeros((0, 2), dtype=np.int64)
    p = np.concatenate(chunks)
    lo, hi = np.minimum(p[:, 0], p[:, 1]), np.maximum(p[:, 0], p[:, 1])
    del p
    keep = host_of[lo] != host_of[hi]
    lo, hi = lo[keep], hi[keep]
    # The chunks are disjoint by construction (DP groups within a stage,
    # partners across two; each chain step adds each row's pairs once), so
    # no sort to deduplicate; tests check that no pair repeats.
    return np.stack([lo, hi], axis=1).astype(np.int64, copy=False)


def rail_aligned(topo: Topology, job: str, eps: list[str], why: str) -> Skeleton:
    nic = [topo.nics[topo.endpoints[e].nic] for e in eps]
    rail_of = np.array([x.rail for x in nic])
    host_codes = {h: k for k, h in enumerate(sorted({x.host for x in nic}))}
    host_of = np.array([host_codes[x.host] for x in nic])
    chunks = []
    for rail in np.unique(rail_of):
        sub = np.flatnonzero(rail_of == rail)
        a, b = np.triu_indices(len(sub), k=1)
        chunks.append(np.stack([sub[a], sub[b]], axis=1))
    return Skeleton(job=job, confidence=0.1, dp=1, tp=1, pp=1, ep=None, dp_groups=[],
                    pp_stages=[], endpoints=list(eps),
                    pair_index=_network_pairs(chunks, host_of), notes=[why])


def ping_list(sk: Skeleton) -> dict[str, list[str]]:
    """Each pair probed from one end, by the controller's stable owner rule."""
    eps = sk.endpoints
    h = np.array([id_hash(e) for e in eps], dtype=np.uint64)
    rank = np.empty(len(eps), dtype=np.int64)
    rank[np.argsort(np.asarray(eps, dtype=object), kind="stable")] = np.arange(len(eps))
    a, b = sk.pair_index[:, 0], sk.pair_index[:, 1]
    lo = np.where(rank[a] < rank[b], a, b)
    hi = np.where(rank[a] < rank[b], b, a)
    bits = owner_bits(h[lo], h[hi])
    src = np.where(bits == 0, lo, hi)
    dst = np.where(bits == 0, hi, lo)
    order = pair_order(src, rank[dst], len(eps))
    src, dst = src[order], dst[order]
    names = np.asarray(eps, dtype=object)[dst]
    bounds = np.searchsorted(src, np.arange(len(eps) + 1))
    out: dict[str, list[str]] = {e: [] for e in sorted(eps)}
    for i, e in enumerate(eps):
        out[e] = names[bounds[i]:bounds[i + 1]].tolist()
    return out
