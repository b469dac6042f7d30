from collections import Counter

from controller.pinglist import (
    Member,
    MemberEndpoint,
    build_lists,
    diff_lists,
    probe_owner,
    rail_aligned_pairs,
)


def members(n_hosts=6, rails=4, active=()):
    out = {}
    for h in range(n_hosts):
        cid = f"c{h}"
        eps = tuple(MemberEndpoint(id=f"{cid}/e{r}", nic=f"n{h}/{r}", host=f"h{h}", rail=r,
                                   ip=f"10.0.{r}.{h}") for r in range(rails))
        out[cid] = Member(id=cid, job="j", host=f"h{h}", endpoints=eps, probe_port=7100,
                          active=cid in active)
    return out


def test_rail_aligned_pairs_are_same_rail_cross_host_once():
    m = members()
    eps = [e for x in m.values() for e in x.endpoints]
    pairs = rail_aligned_pairs(eps)
    by_id = {e.id: e for e in eps}
    assert len(pairs) == 4 * (6 * 5 // 2)
    assert len(set(pairs)) == len(pairs)
    for a, b in pairs:
        assert by_id[a].rail == by_id[b].rail and by_id[a].host != by_id[b].host


def test_two_containers_on_one_host_do_not_probe_each_other():
    m = members(n_hosts=2, rails=1)
    m["c1"] = Member(id="c1", job="j", host="h0", endpoints=(
        MemberEndpoint(id="c1/e0", nic="n0/0", host="h0", rail=0, ip="x"),), probe_port=1,
        active=True)
    assert build_lists(m) == {"c0": {}, "c1": {}}


def test_each_pair_probed_by_exactly_one_side_and_balanced():
    lists = build_lists(members(n_hosts=16, rails=2))
    owners = Counter()
    seen = set()
    for cid, plist in lists.items():
        for (src, dst) in plist:
            key = tuple(sorted((src, dst)))
            assert key not in seen
            seen.add(key)
            assert probe_owner(src, dst) == src
            owners[cid] += 1
    assert len(seen) == 2 * 16 * 15 // 2
    assert max(owners.values()) <= 2.2 * (len(seen) / 16)


def test_activation_follows_target_readiness_and_diff_is_minimal():
    before = build_lists(members(active=()))
    assert not any(t.active for pl in before.values() for t in pl.values())
    after = build_lists(members(active=("c3",)))
    changed = {cid: diff_lists(before[cid], after[cid]) for cid in before}
    flipped = [t for d in changed.values() for t in d.upsert]
    assert flipped and all(t.dst.startswith("c3/") and t.active for t in flipped)
    assert not any(d.remove for d in changed.values())


def test_leaving_container_is_removed_from_others():
    m = members()
    before = build_lists(m)
    del m["c2"]
    after = build_lists(m)
    removed = [k for cid in after for k in diff_lists(before[cid], after[cid]).remove]
    assert removed and all("c2/" in k[0] or "c2/" in k[1] for k in removed)
