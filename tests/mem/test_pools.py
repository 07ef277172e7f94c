import random

import pytest

from kestrel.mem.pools import FreeList, OutOfMemory


def test_free_list_hands_out_the_lowest_free_ids_and_refuses_bad_frees():
    rng = random.Random()
    fl, used = FreeList(40), set()
    for _ in range(300):
        if used and rng.random() < 0.5:
            ids = rng.sample(sorted(used), rng.randint(1, len(used)))
            fl.free(ids)
            used -= set(ids)
        else:
            n = rng.randint(0, 8)
            free = sorted(set(range(1, 40)) - used)
            if n > len(free):
                with pytest.raises(OutOfMemory):
                    fl.alloc(n)
                continue
            got = fl.alloc(n)
            assert got == free[:n]  # lowest first, in order
            used |= set(got)
        fl.check("kv")
        assert fl.used == used
        if used:
            one = min(used)
            for bad in ([one, one], [one, 0], [max(set(range(1, 40)) - used, default=0)]):
                if bad[-1] == 0 and len(bad) == 1:
                    continue
                with pytest.raises(AssertionError, match="double free or foreign id"):
                    fl.free(bad)
                assert fl.used == used  # a refused free changes nothing
                fl.check("kv")
