"""A pairwise (all-pairs) covering set under a black-box oracle: every allowed pair of values in an allowed case.

The axes are lists of values; a case picks one value per axis (an index each). `oracle(case)` answers None when the
case is allowed, or the axes it blames for a refusal (possibly empty): the rules are a black box judged on whole
cases (`dfl.validate` on a whole Config), which is why this is not a library's job: allpairspy's filter sees
partial rows and may leave allowed pairs out, and none of the maintained generators take a whole-case oracle.

The generator is AETG's greedy one (Cohen et al., IEEE TSE 1997), made deterministic (no random tie-breaking: the
lowest index wins) and constrained by the oracle:

1. Each value's *home*: the base case (every axis at its value 0) with that value, or, when the oracle refuses it,
   with one other axis changed too (the first allowed such change). A value with no home is refused everywhere
   the search looks, and so is each of its pairs.
2. While a pair is neither covered nor judged: try it in the base case, in the home of either of its two values,
   and in both homes merged. If the oracle refuses all of them, the pair is *refused* (with the refusal of its
   first context). Otherwise that allowed case is the seed of a new case: every other axis, one at a time, takes
   the value that covers the most pairs not yet covered with the values already chosen. If the oracle refuses the
   completed case, the axes it blames (or else the last one changed) go back to the seed's value, until it allows
   the case, which at worst is the seed.
3. Every pair of an allowed case is covered; a pair first judged refused but later met in an allowed case counts as
   covered (the search in 2 is bounded, the cases are the evidence).

So every pair of values is in an allowed case, or refused in each context tried: `Plan.refused` holds those, with
the case the refusal was seen in. Same axes and oracle, same plan: the order of everything is fixed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Case = tuple[int, ...]
Pair = tuple[int, int, int, int]  # axis a, value of a, axis b > a, value of b
# None: allowed; else the refusal's problems, each as the set of axes it blames
Oracle = Callable[[Case], "list[frozenset[int]] | None"]


@dataclass
class Plan:
    """A covering set: the allowed cases, and every pair no allowed case holds with a case that refuses it."""

    sizes: tuple[int, ...]
    cases: list[Case] = field(default_factory=list)
    refused: dict[Pair, Case] = field(default_factory=dict)

    def pairs(self) -> list[Pair]:
        """Every pair of values of two different axes, in a fixed order."""
        return [(a, v, b, w) for a, b in itertools.combinations(range(len(self.sizes)), 2)
                for v in range(self.sizes[a]) for w in range(self.sizes[b])]

    def covered(self) -> set[Pair]:
        """The pairs some allowed case holds."""
        return {pair for case in self.cases for pair in pairs_of(case)}


def pairs_of(case: Case) -> list[Pair]:
    """The pairs of values a case holds."""
    return [(a, case[a], b, case[b]) for a, b in itertools.combinations(range(len(case)), 2)]


def cover(sizes: Sequence[int], oracle: Oracle) -> Plan:
    """The covering set of axes of `sizes` values under `oracle` (see the module docstring); value 0 is the base."""
    plan = Plan(tuple(sizes))
    n = len(sizes)
    base: Case = (0,) * n
    if oracle(base) is not None:
        raise ValueError("the base case (every axis at its value 0) must be allowed")
    state = _State(sizes, set(plan.pairs()))
    homes = {(a, v): _home(base, a, v, state, oracle) for a in range(n) for v in range(sizes[a])}
    # the pairs of the largest axis pairs first: their cases seed the set, the small axes fill in around them
    order = sorted(plan.pairs(), key=lambda p: (-sizes[p[0]] * sizes[p[2]], p))
    for pair in order:
        if pair not in state.pending:
            continue
        seed, last = _seed(base, pair, homes, oracle)
        if seed is None:
            state.done(pair)
            state.avoid.add(pair)
            plan.refused[pair] = last
            continue
        a, _, b, _ = pair
        fixed = {a, b} | {c for c in range(n) if seed[c] != base[c]}
        case = _complete(seed, fixed, state, oracle)
        plan.cases.append(case)
        for held in pairs_of(case):
            state.done(held)
            plan.refused.pop(held, None)
    return plan


class _State:
    """The pairs still pending (with a count per axis), and those the completions avoid."""

    def __init__(self, sizes: Sequence[int], pending: set[Pair]) -> None:
        self.sizes = tuple(sizes)
        self.pending = pending
        self.count = [0] * len(sizes)
        for a, _, b, _ in pending:
            self.count[a] += 1
            self.count[b] += 1
        self.avoid: set[Pair] = set()  # pairs judged refused, or learned from a refusal that blamed them

    def done(self, pair: Pair) -> None:
        if pair in self.pending:
            self.pending.remove(pair)
            self.count[pair[0]] -= 1
            self.count[pair[2]] -= 1


def _with(case: Case, changes: dict[int, int]) -> Case:
    return tuple(changes.get(axis, value) for axis, value in enumerate(case))


def _home(base: Case, a: int, v: int, state: _State, oracle: Oracle) -> Case | None:
    """The base case with axis a at v, or with one other axis changed as well: the first the oracle allows.

    A refusal of the base case with a at v that blames other axes is remembered: a completion avoids v with their
    base values.
    """
    alone = _with(base, {a: v})
    problems = oracle(alone)
    if problems is None:
        return alone
    state.avoid.update(_key(a, v, d, base[d]) for problem in problems for d in problem if d != a)
    for c, size in enumerate(state.sizes):
        for u in range(1, size):
            if c != a and oracle(candidate := _with(alone, {c: u})) is None:
                return candidate
    return None


def _seed(base: Case, pair: Pair, homes: dict, oracle: Oracle) -> tuple[Case | None, Case]:
    """An allowed case holding `pair` (base, either value's home, both merged), or None and the last case tried."""
    a, v, b, w = pair
    contexts = [base, homes[(a, v)], homes[(b, w)]]
    if homes[(a, v)] is not None and homes[(b, w)] is not None:
        merged = {c: u for home in (homes[(a, v)], homes[(b, w)]) for c, u in enumerate(home) if u != base[c]}
        contexts.append(_with(base, merged))
    tried: list[Case] = []
    for context in contexts:  # the last one tried is the most specific: each value in a case that allows it
        if context is None:
            continue
        case = _with(context, {a: v, b: w})
        if case in tried:
            continue
        tried.append(case)
        if oracle(case) is None:
            return case, case
    return None, tried[-1]


def _complete(seed: Case, fixed: set[int], state: _State, oracle: Oracle) -> Case:
    """`seed` with each free axis at the value covering the most pending pairs, as far as the oracle allows.

    The free axes choose one at a time, the axis with the most pending pairs first, each the value that covers the
    most pending pairs with the values chosen so far and forms no pair of `state.avoid` with them. While the oracle
    refuses the case, the last changed axis each of its problems blames (or else the last one changed) is banned from
    its value and chooses again; an axis with no value that gains keeps the seed's. A problem that blames one changed
    axis and some fixed ones, or two changed axes, is remembered as pairs avoided from then on (most refusals are of
    one value with the algorithm or the topology that seeded the case, or of two network options).
    """
    sizes, pending, avoid = state.sizes, state.pending, state.avoid
    case = list(seed)
    banned: set[tuple[int, int]] = set()
    changed: list[int] = []  # the free axes moved off the seed's value, in the order they were moved
    choosing = sorted((c for c in range(len(sizes)) if c not in fixed), key=lambda c: (-state.count[c], c))
    chosen = sorted(fixed)
    while True:
        for c in choosing:
            best, most = seed[c], 0
            for u in range(sizes[c]):
                if (c, u) in banned:
                    continue
                keys = [_key(c, u, d, case[d]) for d in chosen]
                if any(key in avoid for key in keys):
                    continue
                gain = sum(key in pending for key in keys)
                if gain > most:
                    best, most = u, gain
            case[c] = best
            chosen.append(c)
            if best != seed[c]:
                changed.append(c)
        problems = oracle(tuple(case))
        if problems is None:
            return tuple(case)
        # each problem moves back the last changed axis it blames; a problem of one changed value with fixed ones, or
        # of two changed values, is remembered as a pair to avoid from now on
        choosing = []
        for problem in problems:
            culprits = [c for c in changed if c in problem]
            if culprits and culprits[-1] not in choosing:
                choosing.append(culprits[-1])
            if len(culprits) == 1:
                avoid.update(_key(culprits[0], case[culprits[0]], d, case[d]) for d in problem & fixed)
            elif len(culprits) == 2:
                avoid.add(_key(culprits[0], case[culprits[0]], culprits[1], case[culprits[1]]))
        choosing = choosing or changed[-1:]
        if not choosing:  # only the seed's axes are left, and the seed was allowed: the oracle is not consistent
            raise ValueError(f"the oracle refused {tuple(case)}, whose seed {seed} it allowed")
        for c in choosing:
            banned.add((c, case[c]))
            case[c] = seed[c]
            changed.remove(c)
            chosen.remove(c)


def _key(c: int, u: int, d: int, x: int) -> Pair:
    return (c, u, d, x) if c < d else (d, x, c, u)
