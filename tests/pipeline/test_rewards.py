"""GSM8K reward: final-answer correctness + format reward (services/pipeline/rewards.py)."""

import pytest

from services.pipeline.rewards import RewardBreakdown, answers_match, gsm8k_reward

F = 0.1


def test_correct_and_well_formatted():
    r = gsm8k_reward("She has 3 + 15 = 18 apples.\n#### 18", "18")
    assert r == RewardBreakdown(correct=1.0, format=F, total=1.0 + F)


@pytest.mark.parametrize(
    "response, gold",
    [
        ("#### 18.00", "18"),  # trailing .00
        ("#### 18.0", "18"),
        ("#### 18", "18.00"),  # gold side normalized too
        ("#### 18.", "18"),
        ("#### $1,000", "1000"),  # '$' and thousands comma
        ("#### 1000", "$1,000"),
        ("#### 1,000.00", "1000"),
        ("#### 18.5", "18.50"),  # numeric comparison, not string
        ("#### -3", "-3.0"),
    ],
)
def test_numeric_equivalence(response, gold):
    r = gsm8k_reward(response, gold)
    assert r.correct == 1.0 and r.format == F and r.total == pytest.approx(1.0 + F)


def test_wrong_answer_still_gets_format_reward():
    r = gsm8k_reward("2 + 2 = 5\n#### 17", "18")
    assert (r.correct, r.format, r.total) == (0.0, F, F)


def test_missing_marker_gets_nothing():
    r = gsm8k_reward("The answer is 18.", "18")
    assert (r.correct, r.format, r.total) == (0.0, 0.0, 0.0)
    assert gsm8k_reward("", "18").total == 0.0
    assert gsm8k_reward("####", "18").total == 0.0  # marker without a number


def test_trailing_text_after_the_number_loses_the_format_reward():
    # correctness reads only the line after the last '####'; the format reward needs the number at the very end
    r = gsm8k_reward("#### 18\nHope this helps!", "18")
    assert (r.correct, r.format, r.total) == (1.0, 0.0, 1.0)
    assert gsm8k_reward("#### 18 apples", "18").format == 0.0
    assert gsm8k_reward("#### 18 is the answer. #### twelve", "18").total == 0.0  # the last marker counts


def test_trailing_whitespace_is_fine_and_last_marker_counts():
    assert gsm8k_reward("#### 18  \n\n", "18").total == pytest.approx(1.0 + F)
    assert gsm8k_reward("#### 5 so far ... #### 18", "18").total == pytest.approx(1.0 + F)
    assert gsm8k_reward("#### 18 so far ... #### 5", "18").total == pytest.approx(F)


def test_gold_may_be_a_full_reference_solution():
    gold = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 1,072"
    assert gsm8k_reward("#### 1072", gold).correct == 1.0


def test_format_reward_is_configurable():
    r = gsm8k_reward("#### 18", "18", format_reward=0.0)
    assert (r.correct, r.format, r.total) == (1.0, 0.0, 1.0)
    assert gsm8k_reward("#### 7", "18", format_reward=0.25).total == 0.25


def test_answers_match_edge_cases():
    assert not answers_match(None, "18")
    assert not answers_match("18", None)
    assert answers_match("abc", "abc")  # non-numeric: string equality
    assert not answers_match("18", "180")
