"""The verify planner and its guard, on their own: which draft positions a plan keeps against a step-time profile,
and which mode the guard serves."""

import torch

from kestrel.spec.planner import StepProfile, VerifyPlanner


def test_planner_keeps_positions_while_they_pay():
    # padded cost (the longest block sets the price): flat, then steep
    prof = StepProfile({16: [(1, 1.0, 1.0), (2, 1.0, 1.0), (3, 2.0, 2.0), (4, 4.0, 4.0)]})
    planner = VerifyPlanner(prof)
    conf = torch.full((16, 3), 0.9)
    kept = planner.plan(conf, [3] * 16)
    assert kept == [1] * 16  # the first extra token is free, the second costs more than it brings
    assert VerifyPlanner(prof).plan(torch.full((4, 3), 0.9), [3] * 4) == [3] * 4  # below batch 8: no pruning
    # the plan's predicted rate is never below verify-all's
    for seed in range(20):
        conf = torch.rand(16, 3, generator=torch.Generator().manual_seed(seed))
        kept = planner.plan(conf, [3] * 16)
        surv = torch.cumprod(conf.double(), 1)

        def rate(k):
            return (16 + sum(float(surv[r, :n].sum()) for r, n in enumerate(k))) / prof.cost(16, 16 + sum(k), 1 + max(k))

        assert rate(kept) >= rate([3] * 16) - 1e-12


def test_planner_counts_the_fixed_part_of_a_step():
    """A step's drafting, acceptance and fold cost the same whatever is pruned: with them priced in, cutting the
    steep last position no longer pays. A plan within the margin of verify-all verifies everything."""
    prof = StepProfile({16: [(1, 1.0, 1.0), (2, 1.0, 1.0), (3, 2.0, 2.0), (4, 4.0, 4.0)]})
    conf = torch.full((16, 3), 0.9)
    assert VerifyPlanner(prof).plan(conf, [3] * 16) == [1] * 16
    assert VerifyPlanner(prof, fixed=3.0).plan(conf, [3] * 16) == [2] * 16  # 43.4 / 5 against 55.0 / 7
    assert VerifyPlanner(prof, fixed=100.0).plan(conf, [3] * 16) == [3] * 16
    # fixed 5: two drafts (43.4 / 7) beat verify-all (55.0 / 9) by 1.3%, inside the margin
    assert VerifyPlanner(prof, fixed=5.0).plan(conf, [3] * 16) == [3] * 16
    assert VerifyPlanner(prof, fixed=5.0, margin=1.0).plan(conf, [3] * 16) == [2] * 16


def plan_loop(profile, confidence, max_drafts, fixed=0.0, margin=1.05):
    """The planner written as the plain best-first scan (the oracle of the vectorised plan)."""
    B = len(max_drafts)
    surv = torch.cumprod(confidence.double(), 1)
    kept, expected, tokens, longest = [0] * B, float(B), B, 1
    best_rate, best = expected / (fixed + profile.cost(B, tokens, 1)), list(kept)
    cands = sorted(((float(surv[r, i]), r, i) for r in range(B) for i in range(max_drafts[r])),
                   key=lambda c: (-c[0], c[1], c[2]))
    for s, r, i in cands:
        kept[r], expected, tokens, longest = i + 1, expected + s, tokens + 1, max(longest, i + 2)
        rate = expected / (fixed + profile.cost(B, tokens, longest))
        if rate > best_rate:
            best_rate, best = rate, list(kept)
    return best if best_rate > margin * expected / (fixed + profile.cost(B, tokens, longest)) else list(max_drafts)


def test_vectorised_planner_equals_the_scan():
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        B = int(torch.randint(8, 40, (1,), generator=g))
        gamma = int(torch.randint(1, 8, (1,), generator=g))
        rows = {}
        for bucket in (8, 16, 32, 64):
            base = float(torch.rand(1, generator=g)) + 0.5
            rows[bucket] = [(L, base + 0.1 * L * float(torch.rand(1, generator=g)), base + 0.3 * L)
                            for L in range(1, gamma + 2)]
        prof = StepProfile(rows)
        conf = torch.rand(B, gamma, generator=g)
        if trial % 5 == 0:
            conf[:, : gamma // 2] = 1.0  # ties
        max_drafts = torch.randint(0, gamma + 1, (B,), generator=g).tolist()
        fixed = [0.0, 0.5, 3.0][trial % 3]
        for margin in (1.0, 1.05):
            assert VerifyPlanner(prof, fixed=fixed, margin=margin).plan(conf, max_drafts) == \
                plan_loop(prof, conf, max_drafts, fixed, margin), trial


def test_planner_prices_ragged_blocks():
    """Packed cost (one long block among short ones is nearly free): confident requests keep their drafts, doubtful
    ones are cut; under padded cost the same confidences keep all or nothing."""
    conf = torch.cat([torch.full((8, 3), 0.95), torch.full((8, 3), 0.05)])
    packed = StepProfile({16: [(L, 1.0 + 0.01 * L, 1.0 + 0.5 * (L - 1)) for L in range(1, 5)]})
    kept = VerifyPlanner(packed).plan(conf, [3] * 16)
    assert kept[:8] == [3] * 8 and kept[8:] == [0] * 8
    padded = StepProfile({16: [(L, 1.0 + 0.5 * (L - 1), 1.0 + 0.5 * (L - 1)) for L in range(1, 5)]})
    kept = VerifyPlanner(padded).plan(conf, [3] * 16)
    assert len(set(kept[:8])) == 1 and max(kept) == max(kept[:8])


def test_plan_guard_serves_the_faster_mode_and_probes_the_other():
    """The guard tries each mode `warm` times (the planner first), then serves the one with the higher measured
    tokens per second and gives the other one step in `probe_every`; a mode that gets faster wins back."""
    from kestrel.spec.planner import PlanGuard

    guard = PlanGuard(probe_every=4, warm=2)
    speed = {True: 100.0, False: 300.0}  # the planner prunes drafts that would have paid: verify-all is faster
    served = []
    for step in range(40):
        planned = guard.use_planner(16)
        served.append(planned)
        guard.record(16, planned, int(speed[planned]), 1.0)
        if step == 20:
            speed[True] = 600.0  # now pruning pays
    assert served[:4] == [True, False, True, False]
    assert served[4:20].count(True) == 4  # only the probes
    assert served[-8:].count(False) == 2  # after the change the planner is served, verify-all probed
    assert guard.use_planner(64) is True  # buckets are separate
