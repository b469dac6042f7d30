"""Per-flow route evidence: what each window's traced probes say about the
links they crossed. A probe's route is its flow's forward path, known for
lost probes too, so a link is accused by the losses and slow probes that
went along it and cleared by the healthy probes that crossed it, siblings
compared within each pair (per-flow blame, as in 007: Arzani et al., NSDI
2018). Kept apart from the engine: it holds the route state (each pair's
latest route, this window's sums, each link's healthy history) and answers
the engine's questions about it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

import numpy as np

from analyzer.batch import WindowBatch
from analyzer.detect import LOSS_SCALES, Carry, healthy_rate, scaled_loss_logp
from analyzer.localize import LOSSY, Pair
from analyzer.paths import UnderlayPaths
from analyzer.routesums import RouteSums
from netskel.arrays import csr_rows, find_sorted, unique, unique_rows_inverse
from netskel.config import AnalyzerConfig
from netskel.topology import Topology


class RouteEvidence:
    """The route state one analyzer keeps, and the questions it answers:
    which links a pair may cross or accuses, which links lost or slowed
    probes this window, which ones healthy pairs clear."""

    def __init__(self, topo: Topology, paths: UnderlayPaths, cfg: AnalyzerConfig) -> None:
        self.topo = topo
        self.paths = paths
        self.cfg = cfg
        self._cand_cache: dict[tuple[Pair, str, str], dict[str, float]] = {}
        # Latest traced route per pair: (the prober that traced it, route from it).
        self.latest: dict[Pair, tuple[str, str]] = {}
        # This window's probes of each pair by (prober, forward route):
        # [sent, lost, received-weighted sum of (route median - its row's
        # median), received, received-weighted sum of the row medians, rows
        # (sizes) with an RTT on the route, rows where it was slow].
        self.sums = RouteSums.empty()
        # Link ids for the route sums' link lists, and each route entry's
        # links by codes while the batches share their name lists (offline).
        self._link_index: dict[str, int] = {}
        self._link_names: list[str] = []
        self._entry_links_cache = _EntryLinks([], [])
        # Per link, healthy routed probes seen (sent, lost), and every
        # probe of its last windows: the route-evidence loss test's state.
        self._link_hist: dict[str, tuple[float, float]] = {}
        self._link_carry = Carry.empty(0)
        # This window's routed probes on each link an open loss incident
        # names: (sent, lost, expected lost at the link's healthy rate), for
        # telling a lossy link's quiet window from its end.
        self.link_window: dict[str, tuple[float, float, float]] = {}
        self._route_link_cache: dict[tuple[Pair, str, str], tuple[tuple[str, ...], bool]] = {}
        self.flagged: set[str] = set()  # lossy or slow by the per-link tests, this window

    def spread(self, pair: Pair) -> dict[str, float]:
        """Links the pair's shortest paths cross, each weighted by the share
        of ECMP paths through it (1 for those every path crosses)."""
        a, b = pair
        if a not in self.topo.endpoints or b not in self.topo.endpoints:
            return {}
        return self.paths.weighted_links(self.topo.endpoints[a].nic, self.topo.endpoints[b].nic)

    def candidates(self, pair: Pair) -> dict[str, float]:
        """Links the pair may cross (cached: the topology is fixed). A probe
        goes and returns: the traced route is the going half, crossed for
        sure (weight 1); the reply may hash onto any ECMP alternative, so
        every shortest path keeps its spread weight unless the trace pins it."""
        src, route = self.latest.get(pair, ("", ""))
        got = self._cand_cache.get((pair, src, route))
        if got is None:
            a, b = pair
            if a not in self.topo.endpoints or b not in self.topo.endpoints:
                got = {}
            else:
                got = self.spread(pair)
                links, complete = self._route_links(pair, src, route) if route else ((), False)
                if complete:
                    got = {**got, **dict.fromkeys(links, 1.0)}
            self._cand_cache[(pair, src, route)] = got
        return got

    def _route_links(self, pair: Pair, src: str, route: str) -> tuple[tuple[str, ...], bool]:
        """(the links of a forward route the topology knows, whether it knows
        them all). The route runs from the endpoint that traced it, which may
        be either end of the (sorted) pair."""
        got = self._route_link_cache.get((pair, src, route))
        if got is None:
            a, b = pair
            na, nb = self.topo.endpoints[a].nic, self.topo.endpoints[b].nic
            links = self.paths.route_links(*((nb, na) if src == b else (na, nb)),
                                           route.split(">"))
            known = tuple(k for k in links if k in self.topo.links)
            got = self._route_link_cache[(pair, src, route)] = (known, len(known) == len(links))
        return got

    def note(self, b: WindowBatch) -> None:
        """Each pair's latest traced route, and this window's probes per
        (pair, tracing end, route): sent, lost, and against each size row's
        own median (sizes differ in RTT, and a route may carry more of one
        size than another) the RTT excess, received probes, level, rows that
        saw the route and rows that found it slow. Summed in one pass over
        the batch's route entries; only the sums become Python values."""
        self.sums = RouteSums.empty()
        self.flagged = set()
        self.link_window = {}
        if not len(b):
            return
        names = b.names
        # Pairs as (first, second) in pair_key's order, by each name's rank.
        rank = np.empty(len(names), dtype=np.int64)
        rank[np.argsort(np.asarray(names, dtype=object), kind="stable")] = np.arange(len(names))
        swap = rank[b.src] > rank[b.dst]
        pa, pb = np.where(swap, b.dst, b.src), np.where(swap, b.src, b.dst)
        traced = np.flatnonzero(b.route >= 0)
        if len(traced):  # the last window of each pair with a route wins, as before
            last = traced[::-1]
            # Pairs in (first, second) order, each at its first place in `last`.
            key = pa[last].astype(np.int64) * len(names) + pb[last]
            by_key = np.argsort(key, kind="stable")
            k = key[by_key]
            win = last[by_key[np.r_[True, k[1:] != k[:-1]]]]
            rn = b.route_names
            for a, c, src, r in zip(pa[win].tolist(), pb[win].tolist(), b.src[win].tolist(),
                                    b.route[win].tolist(), strict=True):
                self.latest[(names[a], names[c])] = (names[src], rn[r])
        m = int(b.r_ptr[-1])
        if m == 0:
            return
        known = np.fromiter((x in self.topo.endpoints for x in names), dtype=bool,
                            count=len(names))
        wi = np.repeat(np.arange(len(b), dtype=np.int64), np.diff(b.r_ptr))
        keep = np.flatnonzero(known[b.src[wi]] & known[b.dst[wi]])
        if not len(keep):
            return
        # A route is slow against the row's median or the fastest of the
        # row's other routes this window, whichever is lower: a fault on the
        # path most of a pair's flows take moves the median with it (several
        # flows through one uplink of a three-tier fabric), and the slow
        # route then looked usual. A row's only route keeps the median.
        other = _fastest_other(b.r_ptr, b.r_median, wi)[keep]
        wi = wi[keep]
        sent, lost, med = b.r_sent[keep], b.r_lost[keep], b.r_median[keep]
        level = np.fmin(b.stats[wi, 1], other)  # fmin: a NaN median leaves the other route
        need = np.maximum(self.cfg.latency_min_shift_us, self.cfg.latency_rel_shift * level)
        with np.errstate(invalid="ignore"):
            ok = (sent > lost) & np.isfinite(med) & np.isfinite(level)
            n = np.where(ok, sent - lost, 0).astype(np.float64)
            excess = np.where(ok, med - level, 0.0)
            slow = ok & (excess >= need)
        keys = np.stack([pa[wi], pb[wi], b.src[wi], b.r_route[keep]], axis=1)
        uniq, inv = unique_rows_inverse(keys)
        u = len(uniq)
        v = np.stack([np.bincount(inv, weights=w, minlength=u) for w in (
            sent.astype(np.float64), lost.astype(np.float64), excess * n, n,
            np.where(ok, level, 0.0) * n, ok.astype(np.float64), slow.astype(np.float64))],
            axis=1)
        # uniq is sorted by pair: each pair's entries are one run.
        starts = np.flatnonzero(np.r_[True, np.any(uniq[1:, :2] != uniq[:-1, :2], axis=1)])
        pairs = [(names[a], names[c]) for a, c in uniq[starts, :2].tolist()]
        pidx = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, u]))
        lptr, lid = self._entry_links(b, uniq)
        self.sums = RouteSums(pairs, {p: k for k, p in enumerate(pairs)},
                              np.r_[starts, u].astype(np.int64), pidx,
                              [names[x] for x in uniq[:, 2].tolist()],
                              [b.route_names[x] for x in uniq[:, 3].tolist()], v, lptr, lid)

    def _entry_links(self, b: WindowBatch, uniq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each route entry's known links as link ids (CSR). Cached by codes
        while batches share their name lists (offline: every window), so a
        window looks its entries up in one search and computes only the
        entries it has not seen."""
        cache = self._entry_links_cache
        if cache.names is not b.names or cache.rnames is not b.route_names:
            cache = self._entry_links_cache = _EntryLinks(b.names, b.route_names)
        key = cache.packed(uniq)
        found, at = find_sorted(cache.keys, key)
        if not found.all():
            names, rnames = b.names, b.route_names
            cache.add(key[~found], [
                tuple(self._link_id(k) for k in self._route_links(
                    (names[a], names[c]), names[src], rnames[r])[0])
                for a, c, src, r in uniq[~found].tolist()])
            at = find_sorted(cache.keys, key)[1]
        return cache.gather(at)

    def _link_id(self, link: str) -> int:
        got = self._link_index.get(link)
        if got is None:
            got = self._link_index[link] = len(self._link_names)
            self._link_names.append(link)
        return got

    def lossy_links(self, tests: int, known: set[Pair], gone: set[str], held: Collection[str]
                    ) -> dict[Pair, dict[str, list[int]]]:
        """Loss per link from every routed probe that crossed it, lost ones
        included (a lost probe's route is its flow's): a link that loses a
        little of every flow through it is significant here long before any
        pair's own share is, since each pair sends only some of its flows
        through it. Each link's rate is tested against its own healthy
        history (floor `loss_baseline`), over the windows a slow loss has
        lasted as well as this one, like the pooled groups (detect.Carry);
        the evidence is the most telling span's probes. Returns the
        pairs whose lost probes crossed a lossy link, with that evidence.
        Pairs already anomalous (`known`) or touching a stopped agent (`gone`)
        are left out: their losses are explained, and would make every link
        on their routes look lossy to the pairs beside them. `held`: the
        links open loss incidents name."""
        cfg = self.cfg
        rt = self.sums
        use = np.array([not (p in known or p[0] in gone or p[1] in gone) for p in rt.pairs],
                       dtype=bool)
        ent, lid = rt.expand(use[rt.pidx] if len(rt.pairs) else np.zeros(0, dtype=bool))
        if not len(lid):
            return {}
        ids, first = np.unique(lid, return_index=True)
        ids = ids[np.argsort(first, kind="stable")]  # links in the order the entries meet them
        nl = len(self._link_names)
        sent_by = np.bincount(lid, weights=rt.v[ent, 0], minlength=nl)
        lost_by = np.bincount(lid, weights=rt.v[ent, 1], minlength=nl)
        links = [self._link_names[i] for i in ids.tolist()]
        sent, lost = sent_by[ids], lost_by[ids]  # this window's, per link
        hs = np.array([self._link_hist.get(k, (0.0, 0.0))[0] for k in links])
        hl = np.array([self._link_hist.get(k, (0.0, 0.0))[1] for k in links])
        rate = healthy_rate(hs, hl, cfg.loss_baseline)
        ring = self._link_carry = self._link_carry.fitted(nl, max(LOSS_SCALES) - 1)
        logp, _, span_sent, span_lost = scaled_loss_logp(sent, lost, rate, ring, LOSS_SCALES,
                                                         cfg.loss_min_lost, cols=ids)
        alpha = cfg.loss_alpha / max(1, tests + len(links))
        out: dict[Pair, dict[str, list[int]]] = {}
        self.link_window = {link: (float(sent[k]), float(lost[k]), float(sent[k] * rate[k]))
                            for k, link in enumerate(links) if link in held}
        for k, link in enumerate(links):
            if logp[k] < np.log(alpha):
                on = (lid == self._link_index[link]) & (rt.v[ent, 1] > 0)
                self.flagged.add(link)
                for pair in (rt.pairs[i] for i in unique(rt.pidx[ent[on]]).tolist()):
                    out.setdefault(pair, {})[link] = [int(span_sent[k]), int(span_lost[k])]
            elif logp[k] >= np.log(cfg.loss_near_alpha) and link not in held:
                # healthy: part of the link's own history (a link an open
                # loss incident names is not: its quiet windows are the
                # fault between detections; nor is a suspicious one)
                h = self._link_hist.get(link, (0.0, 0.0))
                self._link_hist[link] = (h[0] + float(sent[k]), h[1] + float(lost[k]))
        ring.push(sent_by, lost_by)
        return out

    def clears(self, healthy: set[Pair]) -> dict[str, int]:
        """Healthy pairs per link from their routed probes this window: a
        link a pair's probes crossed without loss speaks for it. Links the
        per-link tests found lossy or slow this window are not cleared: a
        link losing 2 % of its probes carries many that arrive."""
        rt = self.sums
        if not len(rt.pairs):
            return {}
        use = np.array([p in healthy for p in rt.pairs], dtype=bool)[rt.pidx]
        ent, lid = rt.expand(use & (rt.v[:, 1] == 0) & ~rt.slow())
        counts = rt.pairs_per_link(ent, lid, len(self._link_names))
        return {self._link_names[i]: int(counts[i]) for i in np.flatnonzero(counts).tolist()
                if self._link_names[i] not in self.flagged}

    def slow_routes(self) -> dict[Pair, dict[str, object]]:
        """Pairs slowed on one of their forward routes by a slow link. A
        fault on one of a pair's ECMP paths slows only the flows hashed onto
        it, which moves the window's median little (a quarter of the probes)
        but shows in full between its routes, with no history needed. A
        route is slow when most size rows that saw it found it slower than
        their median by a real amount (one spike is one row); a link is slow
        when at least two pairs, and half of the pairs whose routes cross it,
        find their route through it slow (per-link evidence from every probe
        that crossed it: one pair's bad luck is not a link)."""
        rt = self.sums
        if not len(rt.pairs):
            return {}
        nl = len(self._link_names)
        seen = rt.v[:, 5] >= 2
        slow = seen & rt.slow()
        crossing = rt.pairs_per_link(*rt.expand(seen), nl)
        s_ent, s_lid = rt.expand(slow)
        slow_on = rt.pairs_per_link(s_ent, s_lid, nl)
        bad_ids = np.flatnonzero((slow_on >= 2) & (2 * slow_on >= crossing))
        self.flagged |= {self._link_names[i] for i in bad_ids.tolist()}
        out: dict[Pair, dict[str, object]] = {}
        hit = np.isin(s_lid, bad_ids)
        for p in unique(rt.pidx[s_ent[hit]]).tolist():
            links = sorted({self._link_names[i] for i in s_lid[hit & (rt.pidx[s_ent] == p)].tolist()})
            lo, hi = int(rt.pstart[p]), int(rt.pstart[p + 1])
            out[rt.pairs[p]] = {"slow_links": links,
                                "route_excess_us": {rt.route[e]: round(float(rt.v[e, 2] / rt.v[e, 3]), 1)
                                                    for e in range(lo, hi) if rt.v[e, 3]}}
        return out

    def accused(self, pair: Pair, symptom: str) -> dict[str, float]:
        """Links an anomalous pair accuses from its own probes' routes: each
        route carries the share of the pair's routed losses (or of its slow
        probes) that went along it, so the link on the failing path gets the
        vote and its ECMP siblings, which the pair's healthy flows crossed,
        get none (per-flow blame, as in 007: Arzani et al., NSDI 2018).
        Without routed evidence the pair's possible paths share the vote."""
        rt = self.sums
        k = rt.index.get(pair)
        if k is None:
            return self.candidates(pair)
        lo, hi = int(rt.pstart[k]), int(rt.pstart[k + 1])
        # Per entry: its lost probes, or its probes when the route was slow.
        w = rt.v[lo:hi, 1] if symptom in LOSSY else np.where(
            rt.slow()[lo:hi], rt.v[lo:hi, 0], 0.0)
        total = float(w.sum())
        share = {(rt.src[lo + i], rt.route[lo + i]): float(w[i]) / total
                 for i in np.flatnonzero(w > 0).tolist()} if total else {}
        if not share:
            # Its traced flows carry none of the trouble: it came from flows
            # not traced, on any of the pair's paths. The traced route is no
            # path the trouble surely took (it was, when a pair had one flow).
            return self.spread(pair)
        got: dict[str, float] = defaultdict(float)
        for (src, route), part in share.items():
            links, complete = self._route_links(pair, src, route)
            if not complete:
                return self.candidates(pair)
            for link in links:
                got[link] += part
        return dict(got)


def _fastest_other(ptr: np.ndarray, median: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Per route entry (CSR by row, `row` each entry's), the lowest median
    RTT among the other entries of its row; inf where it has none."""
    med = np.where(np.isfinite(median), median, np.inf)
    runs = np.flatnonzero(np.diff(ptr) > 0)
    best = np.full(len(ptr) - 1, np.inf)
    if not len(runs):
        return np.asarray(best[row])
    best[runs] = np.minimum.reduceat(med, ptr[runs])
    # Each row's first entry at its best: the others' reference is the best,
    # its own the best of the rest.
    at_best = np.flatnonzero(med == best[row])
    first = at_best[np.r_[True, row[at_best][1:] != row[at_best][:-1]]]
    rest = med.copy()
    rest[first] = np.inf
    second = np.full(len(ptr) - 1, np.inf)
    second[runs] = np.minimum.reduceat(rest, ptr[runs])
    out = np.asarray(best[row])
    out[first] = second[row[first]]
    return out


class _EntryLinks:
    """Route entries' link ids by entry key (pair, tracing end and route
    codes packed into one integer), for one pair of name lists: sorted keys
    and their link ids as CSR, so a window's entries are found by one
    binary search each and gathered without a Python loop."""

    def __init__(self, names: list[str], rnames: list[str]) -> None:
        self.names, self.rnames = names, rnames
        self._radix = (len(names), max(1, len(rnames)))
        self.keys = np.zeros(0, dtype=np.int64)
        self._lists: dict[int, tuple[int, ...]] = {}
        self._ptr = np.zeros(1, dtype=np.int64)
        self._ids = np.zeros(0, dtype=np.int64)

    def packed(self, uniq: np.ndarray) -> np.ndarray:
        """(first, second, tracing end, route) rows as one key each; exact
        while names^3 x routes stays below 2^63 (a million endpoints and
        routes: object arithmetic beyond)."""
        n, r = self._radix
        u = uniq.astype(np.int64 if n ** 3 * r < 2 ** 62 else object)
        return np.asarray(((u[:, 0] * n + u[:, 1]) * n + u[:, 2]) * r + u[:, 3])

    def add(self, keys: np.ndarray, lists: list[tuple[int, ...]]) -> None:
        self._lists.update(zip(keys.tolist(), lists, strict=True))
        self.keys = np.asarray(sorted(self._lists), dtype=keys.dtype)
        ordered = [self._lists[k] for k in self.keys.tolist()]
        lens = np.fromiter(map(len, ordered), dtype=np.int64, count=len(ordered))
        self._ptr = np.zeros(len(ordered) + 1, dtype=np.int64)
        np.cumsum(lens, out=self._ptr[1:])
        self._ids = np.fromiter((x for t in ordered for x in t), dtype=np.int64,
                                count=int(self._ptr[-1]))

    def gather(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row pointer, link ids) of the entries at these cache positions."""
        ptr, idx = csr_rows(self._ptr, at)
        return ptr, self._ids[idx]
