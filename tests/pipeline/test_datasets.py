import json
from pathlib import Path

import pytest

from services.pipeline.datasets import (
    DatasetError,
    GSM8KExample,
    default_dataset_dir,
    extract_final_answer,
    format_prompt,
    format_response,
    load_gsm8k,
)

GOOD = {"question": "What is 2+3?", "answer": "2+3 = <<2+3=5>>5\n#### 5"}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_ok_skips_blank_lines(tmp_path):
    other = {"question": "  How much? ", "answer": "It costs $1,000.\n#### $1,000.00"}
    p = write_lines(tmp_path / "d.jsonl", [json.dumps(GOOD), "", "   ", json.dumps(other)])
    ex = load_gsm8k(p)
    assert ex == [
        GSM8KExample(GOOD["question"], GOOD["answer"], "5", 0),
        GSM8KExample(other["question"], other["answer"], "1000", 1),
    ]


def test_missing_file(tmp_path):
    p = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match="nope.jsonl") as e:
        load_gsm8k(p)
    assert "not found" in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "bad_line, what",
    [
        ('{"question": "q", "answer": ', "malformed JSON"),
        (json.dumps({"answer": "#### 1"}), "missing key 'question'"),
        (json.dumps({"question": "q"}), "missing key 'answer'"),
        (json.dumps({"question": 3, "answer": "#### 1"}), "'question' must be a string"),
        (json.dumps({"question": "q", "answer": ["#### 1"]}), "'answer' must be a string"),
        (json.dumps({"question": "q", "answer": "no final answer here"}), "no final answer"),
        (json.dumps({"question": "q", "answer": "empty final answer ####   "}), "no final answer"),
        (json.dumps([1, 2]), "expected a JSON object"),
    ],
)
def test_errors_name_file_and_line(tmp_path, bad_line, what):
    # line 1 good, line 2 blank, line 3 bad: the message must say "<file>:3"
    p = write_lines(tmp_path / "data.jsonl", [json.dumps(GOOD), "", bad_line])
    with pytest.raises(DatasetError) as e:
        load_gsm8k(p)
    msg = str(e.value)
    assert f"{p}:3:" in msg
    assert what in msg
    assert "\n" not in msg  # one clear line


@pytest.mark.parametrize(
    "text, expected",
    [
        ("#### 72", "72"),
        ("blah\n####  1,000 ", "1000"),
        ("#### $18", "18"),
        ("#### 18.00", "18"),
        ("#### 18.0", "18"),
        ("#### 18.", "18"),
        ("#### 18.50", "18.50"),
        ("#### 0.5", "0.5"),
        ("#### -3", "-3"),
        ("#### 10 \n", "10"),
        ("#### 1 #### 2", "2"),  # the last marker counts
        ("#### 7\nmore text", "7"),  # only the first line after the marker
        ("#### 1 000", "1000"),
        ("no marker 42", None),
        ("####", None),
        ("#### \n", None),
        ("", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_formats():
    assert format_prompt("  How many?\n") == "Question: How many?\nAnswer:"
    assert format_response("\nIt is 4.\n#### 4\n") == " It is 4.\n#### 4"


def test_default_dataset_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TAILSPEC_DATA_DIR", str(tmp_path))
    assert default_dataset_dir() == tmp_path
    monkeypatch.delenv("TAILSPEC_DATA_DIR")
    repo = Path(__file__).resolve().parents[2]
    assert default_dataset_dir() == repo / "data" / "gsm8k"
    assert (default_dataset_dir() / "train.jsonl").is_file() and (default_dataset_dir() / "LICENSE").is_file()


@pytest.fixture(scope="module")
def gsm8k_dir():
    d = default_dataset_dir()
    if not (d / "train.jsonl").is_file():
        pytest.skip(f"GSM8K not found under {d}")
    return d


def test_real_gsm8k_loads(gsm8k_dir):
    train = load_gsm8k(gsm8k_dir / "train.jsonl")
    test = load_gsm8k(gsm8k_dir / "test.jsonl")
    assert len(train) == 7473
    assert len(test) == 1319
    assert train[0].final_answer == "72"
    assert [e.index for e in test[:3]] == [0, 1, 2]
    for e in train + test:
        assert extract_final_answer(e.answer) == e.final_answer
        assert e.final_answer.lstrip("-").replace(".", "", 1).isdigit()
