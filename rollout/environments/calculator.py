"""A built-in example environment: arithmetic word problems with a calculator tool.

The model may write `<calc>EXPRESSION</calc>`; its turn ends there (the stop string), the
expression is evaluated (numbers, + - * / and parentheses only) and `<result>VALUE</result>` is
appended to its answer, which it then continues. A turn without a calculator call ends the
episode: reward 1.0 when its last number is the row's `answer`, 0.0 otherwise. It reads the
dataset's `prompt` (chat messages) and `answer` columns, as the built-in `arithmetic` and
`gsm_symbolic` datasets have them.

    python scripts/train_grpo.py --config configs/tool-calculator.yaml
"""

from __future__ import annotations

import ast
import operator
import re

from rollout.environments.base import StepResult

TOOL_INSTRUCTION = (
    "You have a calculator: write <calc>EXPRESSION</calc>, for example <calc>3 + 4</calc>, "
    "and its result follows."
)
_CALL = re.compile(r"<calc>(.*?)</calc>\s*$", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression; ValueError for anything else (no names, calls or
    attributes are ever evaluated)."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an expression: {expression!r}") from err

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"only numbers and + - * / ( ) are allowed: {expression!r}")

    return value(tree.body)


def _format(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:.6g}"


class CalculatorEnv:
    stop = ("</calc>",)

    def __init__(self) -> None:
        self.answer: str | None = None
        self.calls = 0

    def reset(self, row: dict) -> list[dict]:
        self.answer = str(row["answer"])
        messages = [dict(m) for m in row["prompt"]]
        messages[-1]["content"] = f"{messages[-1]['content']} {TOOL_INSTRUCTION}"
        return messages

    def step(self, model_text: str) -> StepResult:
        call = _CALL.search(model_text)
        if call is None:
            numbers = _NUMBER.findall(model_text)
            correct = bool(numbers) and float(numbers[-1]) == float(self.answer)
            return StepResult(done=True, reward=1.0 if correct else 0.0)
        self.calls += 1
        try:
            result = _format(evaluate(call.group(1)))
        except (ValueError, ZeroDivisionError, OverflowError):
            result = "error"  # the model's mistake, shown to it: not a tool failure
        return StepResult(observation=f"<result>{result}</result>")
