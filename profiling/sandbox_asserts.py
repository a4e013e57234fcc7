"""The checks the MBPP sandbox's tests run under (stdlib only; imported by :mod:`.sandbox_harness` before it
locks itself down).

A solution runs in the tests' own namespace, so it could return an object equal to anything (``__eq__`` always
True) and pass every ``assert f(x) == y``. :func:`tests_tree` rewrites the tests so that every comparison
(:func:`compare`), every assertion and every negation (:func:`checked`) first checks its values hold nothing whose
comparison or truth the solution defines. Accidents and lazy hacks fail; code written to fool the grader (reading
the harness's memory) is out of reach of any in-process check (docs/security.md).
"""

import ast
import operator

_CONTAINERS = (list, tuple, set, frozenset, dict)
# what a comparison, a membership test or a truth test of the tests calls on a value
_DUNDERS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__", "__contains__")
SOLUTION_FILE = "solution.py"  # the file name the harness compiles the solution under
# the comparisons as syntax, not the operator module's functions: the solution runs in this process and could
# replace operator.eq and the like
_OPS = {
    "Eq": lambda a, b: a == b,
    "NotEq": lambda a, b: a != b,
    "Lt": lambda a, b: a < b,
    "LtE": lambda a, b: a <= b,
    "Gt": lambda a, b: a > b,
    "GtE": lambda a, b: a >= b,
    "In": lambda a, b: a in b,
    "NotIn": lambda a, b: a not in b,
    "Is": lambda a, b: a is b,
    "IsNot": lambda a, b: a is not b,
}
_code_file = operator.attrgetter("__code__.co_filename")


def _own(t):
    """True when type ``t`` has a comparison or truth method written in the solution (a Python function compiled
    from its file), however it was made: ``class X(int)``, ``type(...)``, a lambda assigned to ``__eq__``."""
    for name in _DUNDERS:
        f = getattr(t, name, None)
        try:
            if _code_file(f) == SOLUTION_FILE:
                return True
        except AttributeError:  # a C slot (int, Counter's parent dict, numpy): not the solution's
            continue
    return False


def _honest(v):
    """True when ``v`` holds no value whose comparison or truth the solution defines (:func:`_own`); standard and
    library types, subclasses included (Counter, namedtuple, numpy scalars), compare as they do anywhere."""
    stack, seen, own = [v], set(), {}
    while stack:
        x = stack.pop()
        t = type(x)
        if t not in own:
            own[t] = _own(t)
        if own[t]:
            return False
        if t in _CONTAINERS and id(x) not in seen:
            seen.add(id(x))
            stack.extend(x.items() if t is dict else x)
    return True


def checked(v):
    if not _honest(v):
        raise AssertionError(f"a {type(v).__name__} whose comparison the solution defines")
    return v


def compare(left, ops, rights):
    """A (chained) comparison as Python evaluates it, each operand checked first; the result is the operator's own
    (a numpy array stays an array)."""
    result = True
    for i, (op, right) in enumerate(zip(ops, rights)):
        if i and not result:  # a chain stops at the first false link, as Python's does
            return result
        result = _OPS[op](checked(left), checked(right))
        left = right
    return result


def tests_tree(tests):
    """The tests with every comparison, assertion and negation checked by :func:`_honest` first: a solution
    returning an object equal to anything (``__eq__`` always True) fails instead of passing."""

    class Checked(ast.NodeTransformer):
        def visit_Compare(self, node):
            self.generic_visit(node)
            ops = ast.List([ast.Constant(type(o).__name__) for o in node.ops], ast.Load())
            args = [node.left, ops, ast.List(node.comparators, ast.Load())]
            return ast.Call(ast.Name("__er_compare__", ast.Load()), args, [])

        def _wrap(self, expr):
            return ast.Call(ast.Name("__er_checked__", ast.Load()), [expr], [])

        def visit_Assert(self, node):
            self.generic_visit(node)
            node.test = self._wrap(node.test)
            return node

        def visit_UnaryOp(self, node):
            self.generic_visit(node)
            if isinstance(node.op, ast.Not):
                node.operand = self._wrap(node.operand)
            return node

    return ast.fix_missing_locations(Checked().visit(ast.parse(tests, "tests.py")))
