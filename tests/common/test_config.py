"""Config loading: YAML 1.1's bare off / on words reach ``str`` fields as the words, not as 'False' / 'True';
defaults and range checks of single keys."""

import pytest

from services.common.config import ConfigError, load_config
from services.pipeline.preflight import load_data


def test_off_override_reaches_a_string_field_as_the_word():
    cfg = load_config(None, ["rollout.speculative.drafter=off", "rollout.speculative.enabled=off"])
    assert cfg.rollout.speculative.drafter == "off"  # was 'False' (YAML reads bare off as false)
    assert cfg.rollout.speculative.enabled is False  # a bool field keeps the boolean
    assert load_config(None, ["rollout.speculative.drafter=suffix"]).rollout.speculative.drafter == "suffix"


def test_off_in_a_yaml_file_and_a_bad_word_still_fails(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("rollout:\n  speculative:\n    drafter: off\n    enabled: on\n")
    cfg = load_config(f)
    assert cfg.rollout.speculative.drafter == "off" and cfg.rollout.speculative.enabled is True
    with pytest.raises(ConfigError, match="rollout.speculative.drafter"):
        load_config(None, ["rollout.speculative.drafter=yes"])  # read as true -> 'on': not a drafter
    with pytest.raises(ConfigError, match="rollout.speculative.drafterz"):
        load_config(None, ["rollout.speculative.drafterz=off"])  # unknown keys still fail


def test_trainer_threads_defaults_to_all_cores_and_rejects_a_negative_count():
    assert load_config(None).trainer.threads == 0  # 0 = every usable core
    assert load_config(None, ["trainer.threads=3"]).trainer.threads == 3
    with pytest.raises(ConfigError, match="trainer.threads"):
        load_config(None, ["trainer.threads=-1"])


def test_data_train_problems_keeps_the_first_problems_of_the_train_file():
    cfg = load_config(None, ["task.name=running_total"])
    every = load_data(cfg)
    first = load_data(load_config(None, ["task.name=running_total", "data.train_problems=48"]))
    assert len(every) > 48 and first == every[:48]
    with pytest.raises(ConfigError, match="data.train_problems"):
        load_config(None, ["data.train_problems=0"])
