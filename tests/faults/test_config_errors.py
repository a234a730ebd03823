"""`agentrl train` with a bad config: the field, the value and the fix, exit code 2, no traceback."""

from __future__ import annotations

from typer.testing import CliRunner

from agentrl_sdk.cli import app


def _train(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return CliRunner().invoke(app, ["train", str(path)])


def test_a_misspelt_key_and_a_bad_choice_name_the_field_value_and_fix(tmp_path):
    result = _train(tmp_path, "max_step: 3\npipeline: fast\ndata:\n  batch_sise: 4\n")

    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert lines[0] == f"error: {tmp_path / 'config.yaml'}: invalid TrainConfig (3 problems)"
    assert sorted(lines[1:]) == [
        "  data.batch_sise: unknown key; did you mean 'data.batch_size'? (got 4)",
        "  max_step: unknown key; did you mean 'max_steps'? (got 3)",
        "  pipeline: Input should be 'sync' or 'fully_async' (got 'fast')",
    ]


def test_a_cross_field_rule_and_unreadable_yaml_exit_2(tmp_path):
    rule = _train(tmp_path, "checkpoint:\n  resume: true\n")
    broken = _train(tmp_path, "data: [\n")

    assert rule.exit_code == broken.exit_code == 2
    assert "(top level): checkpoint.resume needs checkpoint.dir" in rule.stderr
    assert "cannot read the config" in broken.stderr and "Traceback" not in broken.output
