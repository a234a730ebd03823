"""docs/reference/cli.md: every command and option of ``agentrl``, current, and the exit codes
it states are the ones the commands return."""

from __future__ import annotations

from typer.testing import CliRunner

from agentrl_sdk.cli import app
from tests.docs._helpers import ROOT, assert_fresh

runner = CliRunner()


def test_page_is_current(gen):
    assert_fresh(gen, "cli.md")


def test_every_command_and_option_is_on_the_page(gen):
    import _ref_cli

    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    commands = _ref_cli.commands(app)
    assert set(commands) == set(_ref_cli.INPUT_ERRORS), "_ref_cli.INPUT_ERRORS: one per command"
    for name, command in commands.items():
        assert f"## `agentrl {name}`" in page
        for param in command.params:
            for opt in param.opts if param.param_type_name == "option" else [param.name.upper()]:
                assert f"`{opt}`" in page, f"{name}: {opt} missing from the page"


def test_a_bad_config_exits_2_with_one_line(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("max_steps: 0\nrollout: {n: two}\n")
    result = runner.invoke(app, ["train", str(config)])
    assert result.exit_code == 2
    assert "max_steps" in result.output and "rollout.n" in result.output
    assert "Traceback" not in result.output


def test_a_missing_config_and_a_usage_error_exit_2(tmp_path):
    assert runner.invoke(app, ["evaluate", str(tmp_path / "none.yaml")]).exit_code == 2
    assert runner.invoke(app, ["train", "--no-such-option", "x.yaml"]).exit_code == 2
    html = runner.invoke(app, ["inspect", "--html", str(tmp_path / "t.html")])
    assert html.exit_code == 2


def test_a_model_that_cannot_be_imported_exits_2(tmp_path):
    missing = tmp_path / "none.gguf"
    result = runner.invoke(app, ["import-model", str(missing), str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
