"""Tasks: loaders (committed test files), prompt formats, answer extraction, judge ratings, registry."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from litellm_energy_router.profiling.judge import Judge, judge_messages, parse_rating, rating_to_score
from litellm_energy_router.profiling.tasks import GradeContext, Task, TaskError, get_task, sample_items, task_names
from litellm_energy_router.profiling.tasks.choice import extract_choice
from litellm_energy_router.profiling.tasks.gsm8k import extract_number
from litellm_energy_router.profiling.tasks.mbpp import extract_code

TASKS = Path(__file__).parent / "data" / "tasks"
SEVEN = ["arc_challenge", "gsm8k", "hellaswag", "mbpp", "mmlu", "mt_bench", "winogrande"]


def test_seven_tasks_registered_and_load_test_files():
    assert task_names() == SEVEN
    for name in SEVEN:
        task = get_task(name)
        assert isinstance(task, Task)
        items = task.load(TASKS / f"{name}.jsonl")
        assert len(items) == 8 and len({i.query_id for i in items}) == 8
        assert all(i.query_id.startswith(f"{name}:{i.id}:") and len(i.query_id.split(":")[2]) == 8 for i in items)
        msgs = task.messages(items[0])
        assert msgs[-1] == {"role": "user", "content": items[0].prompt}


def test_choice_prompt_maps_labels_and_gold():
    arc = {i.id: i for i in get_task("arc_challenge").load(TASKS / "arc_challenge.jsonl")}
    it = arc["T-ARC-004"]  # numeric labels "1".."4", answerKey "2"
    assert it.reference == "B" and "B. chemical to light" in it.prompt
    wg = get_task("winogrande").load(TASKS / "winogrande.jsonl")[1]
    assert wg.reference == "B" and "A. trophy" in wg.prompt and "B. suitcase" in wg.prompt


@pytest.mark.parametrize(
    "text,expected",
    [
        ("The answer is (C).", 2),
        ("B", 1),
        ("Answer: D. zero", 3),
        ("**A**", 0),
        ("(B) Mercury", 1),
        ("I think the correct option is C because it fits.", 2),
        ("answer: b", 1),
        ("A good guess would be that the answer is D", 3),
        ("It is Mercury.", 1),
        ("no idea", None),
        ("The answer is (E).", None),
        ("Between A and B, I pick B. Final answer: B", 1),
        # an explanation's later "option X" mentions are not the answer (they were: the last keyword won)
        ("Answer: A. Option B is Mercury, which is wrong.", 0),
        ("The answer is A (Venus). Choice B, Mercury, is closer.", 0),
        ("**A**\n\nExplanation: option D is Earth.", 0),
        ("I would pick choice C.", 2),
    ],
)
def test_extract_choice(text, expected):
    assert extract_choice(text, ["Venus", "Mercury", "Mars", "Earth"]) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so 3 + 4 = 7\n#### 7", 7),
        ("The answer is $1,200.", 1200),
        ("We get 12 then 14 apples.", 14),
        ("Final answer: -6", -6),
        ("\\boxed{3/4}", 0.75),
        ("The answer is 30 dollars, after 25% off 40.", 30),
        ("nothing numeric", None),
    ],
)
def test_extract_number(text, expected):
    assert extract_number(text) == expected


def test_extract_code():
    assert extract_code("Sure!\n```python\ndef f():\n    return 1\n```\nDone") == "def f():\n    return 1"
    assert extract_code("```\nprint(1)\n```\n```py\ndef g(): pass\n```") == "def g(): pass"
    assert extract_code("[BEGIN]\ndef h(): return 2\n[DONE]") == "def h(): return 2"
    assert extract_code("def k(): return 3") == "def k(): return 3"


ADD = "def add(a, b):\n    return a + b"


@pytest.mark.parametrize(
    "answer",
    [
        "Here you go:\n```python\n" + ADD + "\n```\nThis adds the two numbers.",
        ADD + "\n\nThis function adds a and b.",  # no fence, prose after the code
        "I'll put the code in a ``` fenced block:\n```python\n" + ADD + "\n```\nDone.",  # ``` inside the prose
        "First a helper:\n```python\ndef _plus(a, b):\n    return a + b\n```\nThen:\n```python\n"
        "def add(a, b):\n    return _plus(a, b)\n```",
        "```python\nfrom operator import add as _add\n```\n```python\ndef add(a, b):\n    return _add(a, b)\n```",
        "```python\n>>> add(1, 2)\n3\n```\n```python\n" + ADD + "\n```",  # a doctest session first
        "1. Define the function:\n\n   ```python\n   def add(a, b):\n       return a + b\n   ```\n",  # in a list item
        "~~~python\n" + ADD + "\n~~~\n",
        "````python\n" + ADD + "\n````\n",
        "First attempt:\n```python\ndef add(a, b):\n    return a - b\n```\nOops. Fixed:\n```python\n" + ADD + "\n```",
        "```python\r\ndef add(a, b):\r\n    return a + b\r\n```\r\n",
        "```python\nprint(add(1, 2))\n```\n```python\n" + ADD + "\n\nprint(add(1, 2))\n```",  # a usage block left out
    ],
)
def test_extract_code_finds_the_program_a_correct_answer_holds(answer):
    """Each of these correct answers was graded 0: fences paired across prose, an indented fence, a helper or an
    import in its own block, a corrected second try, ~~~ fences, prose after unfenced code."""
    scope: dict = {}
    exec(compile(extract_code(answer), "solution.py", "exec"), scope)
    assert scope["add"](1, 2) == 3


def test_judge_rating_parse_and_mapping():
    assert parse_rating("Explanation... Rating: [[7]]") == 7
    assert parse_rating("[[11]] no, final [[3]]") == 3
    assert parse_rating("Rating: 9") == 9
    assert parse_rating("great answer") is None
    assert parse_rating("It cites sources [1] and [2]. Rating: 8") == 8  # a bare [N] only when nothing else rates
    assert rating_to_score(1) == 0.0 and rating_to_score(10) == 1.0
    msgs = judge_messages("Q?", "A!", reference="R")
    assert "[The Start of Reference Answer]\nR" in msgs[-1]["content"]

    seen = []

    async def complete(messages):
        seen.append(messages)
        return "fine. Rating: [[10]]" if "good" in messages[-1]["content"] else "meh"

    judge = Judge(complete)
    mt = get_task("mt_bench")
    item = mt.load(TASKS / "mt_bench.jsonl")[3]  # math: reference-guided prompt
    g = asyncio.run(mt.grade(item, "a good answer", GradeContext(judge=judge)))
    assert g.score == 1.0 and "Reference Answer" in seen[-1][-1]["content"]
    g = asyncio.run(mt.grade(item, "bad", GradeContext(judge=judge)))
    assert g.score is None and "no [[rating]]" in g.detail


def test_gsm8k_and_choice_grading():
    gsm = get_task("gsm8k")
    item = gsm.load(TASKS / "gsm8k.jsonl")[4]  # 1,200 / 8 = 150
    assert asyncio.run(gsm.grade(item, "Each class gets 150 pencils.\n#### 150", GradeContext())).score == 1.0
    assert asyncio.run(gsm.grade(item, "#### 151", GradeContext())).score == 0.0
    mmlu = get_task("mmlu")
    item = mmlu.load(TASKS / "mmlu.jsonl")[0]
    assert asyncio.run(mmlu.grade(item, "The answer is (B).", GradeContext())).score == 1.0
    assert asyncio.run(mmlu.grade(item, "(A)", GradeContext())).score == 0.0


def test_sample_is_reproducible_and_sorted():
    items = get_task("mmlu").load(TASKS / "mmlu.jsonl")
    a, b = sample_items(items, 3, seed=1), sample_items(list(reversed(items)), 3, seed=1)
    assert [i.id for i in a] == [i.id for i in b] and len(a) == 3
    assert len(sample_items(items, None, 0)) == 8 and len(sample_items(items, 50, 0)) == 8


def test_bad_task_input_is_one_line_naming_file_line_field(tmp_path):
    f = tmp_path / "mmlu.jsonl"
    f.write_text('{"question": "q", "choices": ["a", "b"], "answer": 0}\n{"question": "q2", "answer": 1}\n')
    with pytest.raises(TaskError) as e:
        get_task("mmlu").load(f)
    assert str(e.value) == f"{f} line 2: task mmlu: missing field 'choices'"
    f.write_text('{"question": "q", "choices": ["a", "b"], "answer": 0}\n{not json\n')
    with pytest.raises(TaskError, match=r"line 2: not valid JSON"):
        get_task("mmlu").load(f)
    f.write_text('{"question": "q", "choices": ["a", "b"], "answer": 5}\n')
    with pytest.raises(TaskError, match=r"line 1: task mmlu: gold answer index 5 out of range"):
        get_task("mmlu").load(f)
    with pytest.raises(TaskError, match="task file not found"):
        get_task("gsm8k").load(tmp_path / "missing.jsonl")
    f.write_bytes(b'{"question": "q\xff", "choices": ["a", "b"], "answer": 0}\n')
    with pytest.raises(TaskError, match=r"mmlu.jsonl: not UTF-8 text \(invalid start byte at byte 15\)"):
        get_task("mmlu").load(f)
    a = tmp_path / "arc.jsonl"
    a.write_text('{"id": "x", "question": 5, "choices": {"label": ["A", "B"], "text": ["a", "b"]}, "answerKey": "A"}\n')
    with pytest.raises(TaskError, match=r"arc.jsonl line 1: task arc_challenge: the question is a int, not text"):
        get_task("arc_challenge").load(a)
    from litellm_energy_router.profiling.shadow_tournament import QueueError, read_queue

    q = tmp_path / "queue.jsonl"
    q.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(QueueError, match=r"queue.jsonl: not UTF-8 text"):
        read_queue(q)
    with pytest.raises(TaskError) as e:
        get_task("squad")
    assert "'squad' is not registered" in str(e.value) and "mmlu" in str(e.value)


def test_graders_read_a_hostile_answer_in_linear_time():
    """A model's answer is graded on the tournament's event loop: "answer" then a run of spaces made the number and
    letter extractors backtrack exponentially (400 spaces: 43 s; a 6-token answer fits any budget). With 5,000
    spaces both return at once; run in a child so a regression fails by its timeout instead of hanging the suite."""
    import subprocess
    import sys

    code = (
        "from litellm_energy_router.profiling.tasks.gsm8k import extract_number\n"
        "from litellm_energy_router.profiling.tasks.choice import extract_choice\n"
        "pad = ' ' * 5000\n"
        "assert extract_number('answer' + pad + 'x') is None\n"
        "assert extract_choice('answer' + pad + '!', list('abcd')) is None\n"
        "assert extract_choice('answer a' * 20000, list('abcd')) is not None\n"
        "extract_choice('A ' * 40000, list('abcd'))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_judge_reply_without_a_rating_is_not_logged():
    """A judge restates the question: its reply (production text in a shadow tournament, even with
    ``privacy.store_text: false``) went into the grade's detail, which the runner logs at WARNING. Its length only."""
    import asyncio

    async def complete(messages):
        return 'The user asks "my SSN is 078-05-1120, can I deduct this?". I cannot rate that.'

    grade = asyncio.run(Judge(complete).rate("my SSN is 078-05-1120, can I deduct this?", "yes"))
    assert grade.score is None and "078-05" not in grade.detail and "characters" in grade.detail


def test_a_record_the_table_cannot_store_is_one_line_when_the_task_loads(tmp_path):
    """An id making a query id over the table's 200-character key, or a lone surrogate (valid JSON: "\\ud83d"), went
    through to the tournament: a pydantic traceback or a UnicodeEncodeError, exit 1. Refused naming the line."""
    a = tmp_path / "arc.jsonl"
    rec = {"question": "q", "choices": {"label": ["A", "B"], "text": ["a", "b"]}, "answerKey": "A"}
    a.write_text(json.dumps({**rec, "id": "ok"}) + "\n" + json.dumps({**rec, "id": "x" * 250}) + "\n")
    with pytest.raises(TaskError, match=r"arc.jsonl line 2: task arc_challenge: item id 'x+'\.\.\. makes a query id"):
        get_task("arc_challenge").load(a)
    a.write_text(json.dumps({**rec, "id": "s", "question": "smile \ud83d please"}) + "\n")
    with pytest.raises(TaskError, match=r"line 1: task arc_challenge: field 'prompt' holds a lone surrogate"):
        get_task("arc_challenge").load(a)
