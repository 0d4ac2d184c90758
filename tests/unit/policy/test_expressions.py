"""CEL expressions: every compile error at its line and column; evaluation to a bool or a clear error."""

from __future__ import annotations

import pytest

from joch.policy.expressions import CompileError, EvaluationError, activation, compile_expression


def error(source: str) -> CompileError:
    with pytest.raises(CompileError) as caught:
        compile_expression(source)
    return caught.value


def test_a_syntax_error_names_its_line_and_column() -> None:
    e = error('object.spec.binary in ["codex",\n  "claude" && ]')
    assert (e.line, e.column) == (2, 15)
    assert "mismatched input ']'" in e.message


def test_an_undeclared_variable_is_a_compile_error_where_it_is_written() -> None:
    e = error('object.kind == "Agent" &&\n    objct.spec.binary == "x"')
    assert (e.line, e.column) == (2, 5)
    assert 'undeclared reference to "objct"' in e.message and "object" in e.message


def test_an_unknown_function_is_a_compile_error_where_it_is_called() -> None:
    e = error('object.spec.binary.frobnicate() == "x"')
    assert (e.line, e.column) == (1, 20)
    assert 'unknown function "frobnicate"' in e.message


def test_comprehension_variables_and_strings_are_not_undeclared() -> None:
    expr = compile_expression('object.spec.args.exists(a, a == "objct" || a.startsWith("namespace"))')
    assert expr.evaluate(activation({"object": {"spec": {"args": ["objct"]}}}))


def test_namespace_is_a_variable_though_cel_reserves_the_word() -> None:
    expr = compile_expression('namespace.environment == "prod" && object.metadata.namespace == namespace.name')
    variables = {"object": {"metadata": {"namespace": "team-a"}},
                 "namespace": {"name": "team-a", "environment": "prod"}}
    assert expr.evaluate(activation(variables)) is True
    # Kubernetes' name for it works too.
    assert compile_expression('namespaceObject.name == "team-a"').evaluate(activation(variables))


def test_positions_after_the_namespace_rewrite_are_the_users() -> None:
    e = error('namespace.name == "a" && namespace.x ==')
    assert (e.line, e.column) == (1, 40)  # just past the end of what was written
    assert "namespaceObject" not in e.message


def test_a_non_bool_result_is_an_evaluation_error() -> None:
    with pytest.raises(EvaluationError, match="must evaluate to true or false, got int 3"):
        compile_expression("1 + 2").evaluate(activation({}))


def test_a_missing_key_and_a_type_mismatch_are_evaluation_errors() -> None:
    with pytest.raises(EvaluationError, match="no such key: missing"):
        compile_expression('object.spec.missing == "x"').evaluate(activation({"object": {"spec": {}}}))
    with pytest.raises(EvaluationError, match="No such overload"):
        compile_expression('object.n + "a" == "x"').evaluate(activation({"object": {"n": 1}}))


def test_null_old_object_on_create() -> None:
    assert compile_expression("oldObject == null").evaluate(activation({"oldObject": None}))
