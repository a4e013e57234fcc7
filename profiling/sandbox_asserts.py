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

_PLAIN = (bool, int, float, complex, str, bytes, type(None), list, tuple, dict, set, frozenset)


def _honest(v):
    """True when ``v`` holds no value whose comparison or truth the solution defines: no instance of a class
    it made (its ``__module__`` is the solution's) and no subclass of a standard type (``class X(int)``)."""
    stack, seen = [v], set()
    while stack:
        x = stack.pop()
        t = type(x)
        if t in _PLAIN:
            if t in (list, tuple, set, frozenset, dict) and id(x) not in seen:
                seen.add(id(x))
                stack.extend(x.items() if t is dict else x)
            continue
        if getattr(t, "__module__", "") == "solution" or issubclass(t, _PLAIN):
            return False
    return True


def checked(v):
    if not _honest(v):
        raise AssertionError(f"a {type(v).__name__} whose comparison the solution defines")
    return v


def compare(left, ops, rights):
    fn = {"Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt}
    fn.update(GtE=operator.ge, In=lambda a, b: a in b, NotIn=lambda a, b: a not in b)
    fn.update(Is=operator.is_, IsNot=operator.is_not)
    for op, right in zip(ops, rights):
        if not fn[op](checked(left), checked(right)):
            return False
        left = right
    return True


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
