"""Config loading: YAML 1.1's bare off / on words reach ``str`` fields as the words, not as 'False' / 'True'."""

import pytest

from services.common.config import ConfigError, load_config


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
