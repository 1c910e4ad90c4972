"""Every (action, reason word) the controller can count, read from its source.

A decision's reason is free text, and its first word is the ``reason`` label of
``slopilot_tuner_actions_total`` (``reasons.py``). This follows each counted reason from
where it is counted (``decide(action, reason)``, ``metrics.action(dep, action, reason)``)
back to the text written first: a literal, or, where the text starts with something
interpolated, what that is: a parameter (its callers' arguments), a local (its
assignments), a loop function's result (its returns), a field of one (where the function
sets it), or ``entered.reason`` (the reasons of the ``Go`` moves into that step's state).

Anything else is an ``Unresolved`` site, so a reason written first from something this
cannot follow (a method's text, an exception, a user's name) fails the scan instead of
passing unseen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.reasons import first_word

LOOP = Path(__file__).parents[2] / "slopilot" / "tuner" / "loop"
STEP_STATES = {"steady": "STEADY", "scaling": "SCALING", "tuning": "TUNING",
               "commit": "COMMIT", "cooldown": "COOLDOWN"}
"""``controller.STEPS``: each step function and the state it runs (checked by a test)."""

Fn = ast.FunctionDef | ast.AsyncFunctionDef


class Unresolved(Exception):
    """A counted reason whose first word the scan cannot follow to a literal."""


@dataclass(frozen=True)
class Written:
    """One reason text the controller writes first: its word and the actions it is
    counted with."""

    word: str
    actions: frozenset[Action]
    where: str


@dataclass(frozen=True)
class _Node:
    node: ast.AST
    fn: Fn | None
    module: str


class Source:
    """The loop package's modules, indexed for following a reason back."""

    def __init__(self, root: Path = LOOP) -> None:
        self.parents: dict[ast.AST, ast.AST] = {}
        self.module: dict[ast.AST, str] = {}
        self.functions: dict[tuple[str, str], list[Fn]] = {}
        self.calls: list[_Node] = []
        for path in sorted(root.glob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for parent in ast.walk(tree):
                for child in ast.iter_child_nodes(parent):
                    self.parents[child] = parent
            for node in ast.walk(tree):
                self.module[node] = path.stem
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.functions.setdefault((path.stem, node.name), []).append(node)
                elif isinstance(node, ast.Call):
                    self.calls.append(_Node(node, self.enclosing(node), path.stem))

    def enclosing(self, node: ast.AST) -> Fn | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return None

    def where(self, node: ast.AST) -> str:
        return f"{self.module[node]}.py:{getattr(node, 'lineno', '?')}"

    # ------------------------------------------------------------------ sites
    def counted(self) -> Iterator[tuple[ast.expr, ast.expr, _Node]]:
        """(action, reason, site) of every call that writes a decision or counts one."""
        for site in self.calls:
            call = site.node
            assert isinstance(call, ast.Call)
            name = _name(call.func)
            if name == "decide" and not (site.fn is not None and site.fn.name == "decide"):
                yield self._given(call, 0, "action"), self._given(call, 1, "reason"), site
            elif name == "action" and isinstance(call.func, ast.Attribute) \
                    and _name(call.func.value) == "metrics":
                if site.fn is not None and site.fn.name == "_emit":
                    continue  # the funnel: it counts what decide() wrote
                yield self._given(call, 1, "action"), self._given(call, 2, "reason"), site
            elif name == "replace" and any(k.arg == "reason" for k in call.keywords):
                self._same_first(call)

    def _given(self, call: ast.Call, index: int, name: str) -> ast.expr:
        """The argument ``name`` of ``call``, given by position or by keyword."""
        for k in call.keywords:
            if k.arg == name:
                return k.value
        if index < len(call.args):
            return call.args[index]
        raise Unresolved(f"{self.where(call)}: {ast.unparse(call.func)} without its {name}")

    def _same_first(self, call: ast.Call) -> None:
        """A ``dataclasses.replace(x, reason=...)`` (a Go or a Decision given another
        reason) is followed only where the new reason starts with ``x``'s own, whose first
        word is checked where ``x`` was made."""
        reason = next(k.value for k in call.keywords if k.arg == "reason")
        head = reason.values[0] if isinstance(reason, ast.JoinedStr) and reason.values \
            else None
        if not (call.args and isinstance(head, ast.FormattedValue)
                and isinstance(head.value, ast.Attribute) and head.value.attr == "reason"
                and ast.dump(head.value.value) == ast.dump(call.args[0])):
            raise Unresolved(f"{self.where(call)}: a reason replaced by a text that does "
                             f"not start with the old one: {ast.unparse(reason)!r}")

    def gos(self, state: str) -> Iterator[tuple[ast.expr, ast.expr, _Node]]:
        """(action, reason, site) of every ``Go`` into ``state``."""
        for site in self.calls:
            call = site.node
            assert isinstance(call, ast.Call)
            if _name(call.func) != "Go":
                continue
            target, reason = self._given(call, 0, "target"), self._given(call, 2, "reason")
            if isinstance(target, ast.Attribute) and target.attr == state:
                action = next((k.value for k in call.keywords if k.arg == "action"),
                              ast.Attribute(ast.Name("Action"), "NONE"))
                yield action, reason, site
            elif not isinstance(target, ast.Attribute):
                raise Unresolved(f"{self.where(call)}: a Go whose target is not a literal "
                                 "ControllerState")

    # ---------------------------------------------------------------- resolve
    def written(self) -> list[Written]:
        out: list[Written] = []
        for action, reason, site in self.counted():
            out += self._pairs(action, reason, site.fn, set())
        return out

    def _pairs(self, action: ast.expr, reason: ast.expr, fn: Fn | None,
               seen: set[tuple[int, str]]) -> list[Written]:
        # Both handed on together: by a step's ``entered`` Go, or a function's parameters.
        if _attr_of(action, "entered", "action") and _attr_of(reason, "entered", "reason"):
            return [w for a, r, site in self.gos(self._state(fn, reason))
                    for w in self._pairs(a, r, site.fn, seen)]
        params = _params(fn)
        if isinstance(action, ast.Name) and isinstance(reason, ast.Name) \
                and action.id in params and reason.id in params:
            assert fn is not None
            return [w for call, caller in self._callers(fn)
                    for w in self._pairs(_arg(call, fn, action.id),
                                         _arg(call, fn, reason.id), caller, seen)]
        actions = self._actions(action, fn, set())
        if actions <= {Action.NONE}:
            return []  # not counted
        return [Written(word, frozenset(actions - {Action.NONE}), where)
                for word, where in self._words(reason, fn, seen)]

    def _state(self, fn: Fn | None, node: ast.AST) -> str:
        if fn is None or fn.name not in STEP_STATES:
            raise Unresolved(f"{self.where(node)}: entered.* outside a step function")
        return STEP_STATES[fn.name]

    def _callers(self, fn: Fn) -> Iterator[tuple[ast.Call, Fn | None]]:
        found = False
        for site in self.calls:
            call = site.node
            assert isinstance(call, ast.Call)
            if _name(call.func) == fn.name and self._callee(call, site.module) is fn:
                found = True
                yield call, site.fn
        if not found:
            raise Unresolved(f"{self.where(fn)}: {fn.name} is called nowhere the scan sees")

    def _callee(self, call: ast.Call, module: str) -> Fn | None:
        """The loop function ``call`` calls: ``name(...)`` in its own module (or imported
        by name), ``module.name(...)``, or ``self.name(...)``/``ctx.name(...)``."""
        name = _name(call.func)
        if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
                and (call.func.value.id, name) in self.functions:
            defs = self.functions[(call.func.value.id, name)]
        elif (module, name) in self.functions:
            defs = self.functions[(module, name)]
        else:
            defs = [f for (_, n), fs in self.functions.items() if n == name for f in fs]
        return defs[0] if len(defs) == 1 else None

    def _actions(self, expr: ast.expr, fn: Fn | None,
                 seen: set[tuple[int, str]]) -> set[Action]:
        if isinstance(expr, ast.Attribute) and _name(expr.value) == "Action":
            return {Action[expr.attr]}
        if isinstance(expr, ast.IfExp):
            return self._actions(expr.body, fn, seen) | self._actions(expr.orelse, fn, seen)
        if isinstance(expr, ast.Name) and fn is not None:
            if (id(fn), expr.id) in seen:
                return set()
            seen.add((id(fn), expr.id))
            found: set[Action] = set()
            values = list(_assigned(fn, expr.id))
            for value in values:
                found |= self._actions(value, fn, seen)
            if expr.id in _params(fn):
                for call, caller in self._callers(fn):
                    found |= self._actions(_arg(call, fn, expr.id), caller, seen)
            elif not values:
                raise Unresolved(f"{self.where(expr)}: action {expr.id} never assigned")
            return found
        raise Unresolved(f"{self.where(expr)}: action {ast.unparse(expr)} not followed")

    def _words(self, expr: ast.expr, fn: Fn | None,
               seen: set[tuple[int, str]]) -> list[tuple[str, str]]:
        """(first word, where it is written) of each text ``expr`` can start with."""
        here = self.where(expr)
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [(_word(expr.value, here, runs_on=False), here)]
        if isinstance(expr, ast.JoinedStr) and expr.values:
            head = expr.values[0]
            if isinstance(head, ast.Constant):
                return [(_word(head.value, here, runs_on=len(expr.values) > 1), here)]
            assert isinstance(head, ast.FormattedValue)
            return self._words(head.value, fn, seen)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            if isinstance(expr.left, ast.Constant):
                return [(_word(expr.left.value, here, runs_on=True), here)]
            return self._words(expr.left, fn, seen)
        if isinstance(expr, ast.IfExp):
            return self._words(expr.body, fn, seen) + self._words(expr.orelse, fn, seen)
        if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
            return [w for v in expr.values for w in self._words(v, fn, seen)]
        if isinstance(expr, ast.Name) and fn is not None:
            if (id(fn), expr.id) in seen:
                return []
            seen.add((id(fn), expr.id))
            values = list(_assigned(fn, expr.id))
            out = [w for v in values for w in self._words(v, fn, seen)]
            if expr.id in _params(fn):
                out += [w for call, caller in self._callers(fn)
                        for w in self._words(_arg(call, fn, expr.id), caller, seen)]
            elif not values:
                raise Unresolved(f"{here}: {expr.id} is not assigned in {fn.name}")
            return out
        if isinstance(expr, ast.Call):
            return self._returns(expr, fn, seen)
        if isinstance(expr, ast.Attribute):
            return self._field(expr, fn, seen)
        raise Unresolved(f"{here}: a reason written first from {ast.unparse(expr)!r}")

    def _returns(self, call: ast.Call, fn: Fn | None,
                 seen: set[tuple[int, str]]) -> list[tuple[str, str]]:
        callee = self._callee(call, self.module[call])
        if callee is None:
            raise Unresolved(f"{self.where(call)}: a reason written first from "
                             f"{ast.unparse(call)!r}, no loop function")
        return [w for node in ast.walk(callee) if isinstance(node, ast.Return)
                and node.value is not None and self.enclosing(node) is callee
                and not (isinstance(node.value, ast.Constant) and node.value.value is None)
                for w in self._words(node.value, callee, seen)]

    def _field(self, expr: ast.Attribute, fn: Fn | None,
               seen: set[tuple[int, str]]) -> list[tuple[str, str]]:
        """``x.field``: where x is what a loop function returned, what it sets the field
        to (its ``Look(field=...)``)."""
        if _attr_of(expr, "entered", "reason"):
            return [w for _, r, site in self.gos(self._state(fn, expr))
                    for w in self._words(r, site.fn, seen)]
        source = expr.value
        if isinstance(source, ast.Name) and fn is not None:
            calls = [v for v in _assigned(fn, source.id) if isinstance(v, ast.Call)]
            if len(calls) != 1:
                raise Unresolved(f"{self.where(expr)}: {ast.unparse(expr)} not followed")
            source = calls[0]
        if not isinstance(source, ast.Call):
            raise Unresolved(f"{self.where(expr)}: {ast.unparse(expr)} not followed")
        callee = self._callee(source, self.module[source])
        if callee is None:
            raise Unresolved(f"{self.where(expr)}: {ast.unparse(source)} no loop function")
        return [w for node in ast.walk(callee) if isinstance(node, ast.Call)
                for k in node.keywords if k.arg == expr.attr
                for w in self._words(k.value, callee, seen)]


def _word(text: str, where: str, *, runs_on: bool) -> str:
    word = first_word(text)
    if not word or not text.lower().startswith(word):
        raise Unresolved(f"{where}: a reason that starts with no word: {text!r}")
    if runs_on and text.lower() == word:
        raise Unresolved(f"{where}: the first word {word!r} runs on into what follows")
    return word


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _attr_of(node: ast.AST, owner: str, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr \
        and isinstance(node.value, ast.Name) and node.value.id == owner


def _params(fn: Fn | None) -> list[str]:
    if fn is None:
        return []
    a = fn.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _arg(call: ast.Call, fn: Fn, name: str) -> ast.expr:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    params = [p.arg for p in (*fn.args.posonlyargs, *fn.args.args)]
    i = params.index(name) - (1 if params and params[0] in ("self", "cls") else 0)
    if i < len(call.args):
        return call.args[i]
    raise Unresolved(f"line {call.lineno}: {fn.name}(...) without its {name}")


def _assigned(fn: Fn, name: str) -> Iterator[ast.expr]:
    """Every value bound to ``name`` in ``fn`` (``=``, ``:=``, tuple unpacking)."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _bound(target, node.value, name)
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
            yield from _bound(node.target, node.value, name)


def _bound(target: ast.expr, value: ast.expr, name: str) -> Iterator[ast.expr]:
    if isinstance(target, ast.Name) and target.id == name:
        yield value
    elif isinstance(target, ast.Tuple):
        if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                yield from _bound(t, v, name)
        elif any(isinstance(t, ast.Name) and t.id == name for t in target.elts):
            raise Unresolved(f"line {value.lineno}: {name} unpacked from "
                             f"{ast.unparse(value)!r}")
