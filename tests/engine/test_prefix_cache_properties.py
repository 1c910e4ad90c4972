"""Property test: the prefix index stays consistent and every hit serves the request's
own KV, whatever the order of admissions, chunks, decodes, finishes, evictions,
preemptions (recompute and swap) and live switches of prefix caching.

The block manager is driven as the scheduler drives it: a step takes blocks for its
chunks first and computes them at the iteration's end, when full blocks are registered,
so requests admitted together compute the same prefix side by side. Next to it runs a
model of what an executor would hold in each GPU and CPU block; the integrity check and
the contents of every live request are checked after every step.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slopilot.engine.block_manager import BlockManager
from slopilot.engine.kv_integrity import check_block_manager
from slopilot.engine.request import Request, SamplingParams

BS = 4
# Both families start alike and then part, so requests hit each other's blocks: whole
# prefixes of one family, or only the first two blocks across families.
FAMILIES = (list(range(1, 25)), list(range(1, 9)) + list(range(100, 116)))

# One KV slot: the salt (a tenant's KV differs even for equal tokens) and the token.
Slot = tuple[str | None, int]
Op = tuple[object, ...]

pick = st.integers(0, 3)  # which request, modulo how many can take the step
chunk = st.sampled_from([1, 2, 4, 8, 24])
admit = st.tuples(st.just("admit"), st.integers(0, 1),  # family
                  st.sampled_from([0, 6, 8, 12, 16, 24]),  # tokens taken from it
                  st.integers(0, 3),  # then tokens of its own
                  st.sampled_from([False, False, True]),  # salted
                  st.integers(1, 12), chunk)  # max tokens, first chunk
# Each kind of step, by weight: admissions and iterations most, so requests overlap and
# share blocks; switches often, so they flip while blocks are shared.
steps: dict[str, tuple[int, st.SearchStrategy[Op]]] = {
    "admit": (4, admit),
    "iterate": (4, st.tuples(st.just("iterate"), chunk)),
    "schedule": (2, st.tuples(st.just("schedule"), pick, chunk)),
    "toggle": (2, st.tuples(st.just("toggle"))),
    "resume": (2, st.tuples(st.just("resume"), pick, chunk)),
    "abort": (1, st.tuples(st.just("abort"), pick)),
    "recompute": (1, st.tuples(st.just("recompute"), pick)),
    "swap_out": (1, st.tuples(st.just("swap_out"), pick)),
}
op_st = st.sampled_from([k for k, (w, _) in steps.items() for _ in range(w)]).flatmap(
    lambda kind: steps[kind][1])


class Driver:
    """Requests in three places, as in the scheduler: running (a GPU table, maybe a
    chunk scheduled), waiting (new or preempted for recompute: admitted through a
    prefix lookup) or swapped out."""

    def __init__(self, kv: BlockManager) -> None:
        self.kv = kv
        self.gpu: dict[int, list[Slot | None]] = {}
        self.cpu: dict[int, list[Slot | None]] = {}
        self.running: dict[str, Request] = {}
        self.waiting: dict[str, Request] = {}
        self.swapped: dict[str, Request] = {}
        # Tokens given blocks this iteration, computed when it runs.
        self.scheduled: dict[str, int] = {}
        self.num_admitted = 0

    @staticmethod
    def slot(req: Request, pos: int) -> Slot:
        return (req.cache_salt, req.token_at(pos))

    def admit(self, family: int, shared: int, tail: int, salted: bool, max_tokens: int,
              n: int) -> None:
        i = self.num_admitted
        self.num_admitted += 1
        prompt = FAMILIES[family][:shared] + [1000 + 16 * i + t for t in range(tail)]
        req = Request(f"r{i}", prompt or [1000 + 16 * i], SamplingParams(max_tokens),
                      cache_salt="t" if salted else None)
        self.waiting[req.request_id] = req
        self.resume(req, n)

    def resume(self, req: Request, n: int) -> None:
        """Start a waiting request after its cached prefix, or swap one back in."""
        kv, rid = self.kv, req.request_id
        if rid in self.swapped:
            pairs = kv.swap_in(rid)
            if pairs is not None:
                for c, g in pairs:
                    self.gpu[g] = list(self.cpu[c])
                self.running[rid] = self.swapped.pop(rid)
            return
        hits = kv.find_cached_prefix(req)
        assert len(hits) * BS < req.num_tokens, "a hit left nothing to compute"
        for i, b in enumerate(hits):  # the KV served is the request's own
            assert self.gpu[b] == [self.slot(req, p) for p in range(i * BS, (i + 1) * BS)]
        n = min(n, req.num_tokens - len(hits) * BS)
        if kv.allocate_slots(req, n, hits):
            req.num_computed_tokens = len(hits) * BS
            self.running[rid] = self.waiting.pop(rid)
            self.scheduled[rid] = n

    def schedule(self, req: Request, n: int) -> None:
        """Blocks for one more chunk of the prompt, or for one decode."""
        n = min(n, req.num_tokens - req.num_computed_tokens)
        if req.request_id not in self.scheduled and n and self.kv.allocate_slots(req, n):
            self.scheduled[req.request_id] = n

    def iterate(self, n: int) -> None:
        """Every running request without a chunk gets one; then the iteration runs."""
        for req in list(self.running.values()):
            self.schedule(req, n)
        scheduled, self.scheduled = self.scheduled, {}
        for rid, num_new in scheduled.items():
            self.compute(self.running[rid], num_new)
        self.kv.begin_step()

    def compute(self, req: Request, n: int) -> None:
        """Write ``n`` tokens' KV, register as the scheduler does (only when the chunk
        filled a block and caching is on), sample when the context is whole."""
        table, start = self.kv.block_table(req.request_id), req.num_computed_tokens
        for p in range(start, start + n):
            self.gpu.setdefault(table[p // BS], [None] * BS)[p % BS] = self.slot(req, p)
        req.num_computed_tokens = computed = start + n
        if self.kv.enable_prefix_caching and computed - start > computed % BS:
            self.kv.cache_full_blocks(req)
        if computed == req.num_tokens:
            # Twins (same prompt) sample the same tokens, so outputs are shared too.
            req.append_output(2000 + (req.token_at(computed - 1) * 31 + computed) % 7)
            if req.num_output_tokens == req.sampling.max_tokens:
                self.finish(req.request_id)

    def finish(self, rid: str) -> None:
        self.kv.free(rid)
        self.scheduled.pop(rid, None)
        for place in (self.running, self.waiting, self.swapped):
            place.pop(rid, None)

    def recompute(self, req: Request) -> None:
        rid = req.request_id
        self.kv.free(rid, keep_chain=True)
        self.scheduled.pop(rid, None)
        req.num_computed_tokens = 0
        self.waiting[rid] = self.running.pop(rid)

    def swap_out(self, req: Request) -> None:
        rid = req.request_id
        if self.kv.can_swap_out(rid):
            for g, c in self.kv.swap_out(rid):
                self.cpu[c] = list(self.gpu.get(g, [None] * BS))
            self.scheduled.pop(rid, None)
            self.swapped[rid] = self.running.pop(rid)

    def apply(self, op: Op) -> None:
        name, args = op[0], op[1:]
        if name == "admit":
            self.admit(*args)  # type: ignore[arg-type]
        elif name == "iterate":
            self.iterate(*args)  # type: ignore[arg-type]
        elif name == "toggle":
            self.kv.set_prefix_caching(not self.kv.enable_prefix_caching)
        elif name == "abort":
            req = _choose({**self.running, **self.waiting, **self.swapped}, args[0])
            if req is not None:
                self.finish(req.request_id)
        elif name == "resume":
            req = _choose({**self.waiting, **self.swapped}, args[0])
            if req is not None:
                self.resume(req, args[1])  # type: ignore[arg-type]
        else:
            req = _choose(self.running, args[0])
            if req is None:
                pass
            elif name == "schedule":
                self.schedule(req, args[1])  # type: ignore[arg-type]
            elif name == "recompute":
                self.recompute(req)
            else:
                self.swap_out(req)

    def check(self) -> None:
        check_block_manager(self.kv)
        for place, tables, kv_of in ((self.running, self.kv.tables, self.gpu),
                                     (self.swapped, self.kv._cpu_tables, self.cpu)):
            for rid, req in place.items():
                table = tables[rid]
                got = [kv_of[table[p // BS]][p % BS] for p in range(req.num_computed_tokens)]
                assert got == [self.slot(req, p) for p in range(req.num_computed_tokens)], rid


def _choose(place: dict[str, Request], i: object) -> Request | None:
    return place[sorted(place)[int(i) % len(place)]] if place else None  # type: ignore[call-overload]


# The outside review's case. r1 computes the shared prefix beside r0, so r1's second
# block stays private (r0 cached its own first) and its third is the cached one; r2 hits
# r0's two blocks and r1's third. Off and on again: r1 re-keys from the root through its
# private second block and finishes; a salted request evicts that block; then r2 re-keys
# from the root through r0's second block, and reaches r1's third under another key.
REVIEW_CASE: list[Op] = [
    ("admit", 0, 8, 0, False, 1, 4), ("iterate", 1),
    ("admit", 0, 12, 2, False, 3, 2), ("iterate", 2), ("iterate", 8),
    ("admit", 0, 12, 1, False, 12, 1), ("iterate", 1),
    ("toggle",), ("toggle",), ("iterate", 1),
    ("admit", 1, 16, 0, True, 1, 24), ("iterate", 1), ("iterate", 1),
]


# Random steps found the review's case in about one run of 3,000 examples; the example
# keeps it in every run.
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_blocks=st.integers(6, 14), num_cpu_blocks=st.integers(0, 16),
       enabled=st.booleans(), ops=st.lists(op_st, min_size=40, max_size=160))
@example(num_blocks=8, num_cpu_blocks=0, enabled=True, ops=REVIEW_CASE)
def test_index_and_contents_hold_after_every_step(
        num_blocks: int, num_cpu_blocks: int, enabled: bool, ops: list[Op]) -> None:
    kv = BlockManager(num_blocks, BS, num_cpu_blocks, enable_prefix_caching=enabled)
    d = Driver(kv)
    for op in ops:
        d.apply(op)
        d.check()
    for rid in [*d.running, *d.waiting, *d.swapped]:
        d.finish(rid)
    kv.begin_step()
    check_block_manager(kv)
    assert kv.num_used_blocks == 0 and kv.num_free_cpu_blocks == num_cpu_blocks
