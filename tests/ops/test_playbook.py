"""Playbook loading: every mistake is one InputFileError naming file:line and the key; rendering
per host is strict (an undefined variable is an error, never an empty string)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ops.errors import InputFileError
from ops.playbook import RenderError, evaluate_when, load_playbook, render

GOOD = """\
name: example
steps:
  - name: release directory
    step: directory
    args: {path: "{{ base }}/releases", mode: 0755}
    when: "{{ profile != 'cpu' }}"
    tags: [layout]
  - step: template
    args:
      src: env.j2
      dest: "{{ base }}/run/demo.env"
      mode: "0600"
    register: env_file
    retries: 2
    ignore_errors: true
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "play.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_good_playbook_loads(tmp_path: Path) -> None:
    book = load_playbook(write(tmp_path, GOOD))
    assert book.name == "example" and book.dir == tmp_path.resolve()
    first, second = book.steps
    assert (first.name, first.step, first.tags, first.line) == (
        "release directory",
        "directory",
        ("layout",),
        3,
    )
    assert (second.name, second.register, second.retries, second.ignore_errors) == (
        "template",
        "env_file",
        2,
        True,
    )


@pytest.mark.parametrize(
    ("text", "line", "message", "hint"),
    [
        (
            "name: x\nsteps:\n  - step: directory\n    args: {path: /a}\n    tag: [x]\n",
            5,
            "step 'directory': unknown key 'tag'",
            "did you mean 'tags'?",
        ),
        ("name: x\nstep:\n  - step: directory\n", 2, "unknown key 'step'", "did you mean 'steps'?"),
        (
            "name: x\nsteps:\n  - step: directroy\n    args: {path: /a}\n",
            3,
            "unknown step 'directroy'",
            "did you mean 'directory'?",
        ),
        (
            "name: x\nsteps:\n  - step: directory\n    args:\n      path: /a\n      mdoe: '0755'\n",
            6,
            "unknown argument 'mdoe' for step 'directory'",
            "did you mean 'mode'?",
        ),
        (
            "name: x\nsteps:\n  - step: template\n    args: {src: a.j2}\n",
            4,
            "missing required argument 'dest'",
            None,
        ),
        (
            "name: x\nsteps:\n  - step: directory\n    args:\n      path: /a\n      mode: rwxr-xr-x\n",
            6,
            "argument 'mode': expected an octal mode",
            None,
        ),
        (
            'name: x\nsteps:\n  - step: directory\n    args:\n      path: "{{ base }/a"\n',
            5,
            "argument 'path' has bad Jinja",
            None,
        ),
        (
            'name: x\nsteps:\n  - step: facts\n    when: "{{ profile == }}"\n',
            4,
            "bad 'when' expression",
            None,
        ),
        ("name: x\nsteps:\n  - step: facts\n    retries: -1\n", 4, "'retries' must be a whole number", None),
        (
            "name: x\nsteps:\n  - step: facts\n    register: f\n  - step: facts\n    register: f\n",
            5,
            "register name 'f' is used twice",
            None,
        ),
        (
            "name: x\nsteps:\n  - step: facts\n    args: {}\n  - step: facts\n    name: a\n    name: b\n",
            7,
            "duplicate key 'name'",
            None,
        ),
        ("name: x\nsteps:\n  - step: facts\n   args: {}\n", 4, "invalid YAML", None),
        ("name: x\nsteps: []\n", 2, "'steps' must be a non-empty list", None),
        ("name: x\nsteps:\n  - directory\n", 3, "step 1 must be a mapping", None),
        (
            "name: x\nsteps:\n  - step: facts\n    args: {verbose: true}\n",
            4,
            "unknown argument 'verbose'",
            "this step takes no arguments",
        ),
    ],
)
def test_bad_playbooks_name_file_line_and_key(
    tmp_path: Path, text: str, line: int, message: str, hint: str | None
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputFileError) as info:
        load_playbook(path)
    error = info.value
    assert str(error).startswith(f"{path}:{line}: "), str(error)
    assert message in str(error)
    if hint:
        assert f"(fix: {hint})" in str(error)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="cannot read playbook"):
        load_playbook(tmp_path / "nope.yaml")


def test_render_keeps_native_types_and_is_strict() -> None:
    variables = {"base": "/opt/s", "serve": {"port": 8000}, "gpus": [0, 1]}
    assert render(
        {"p": "{{ base }}/run", "port": "{{ serve.port }}", "ids": "{{ gpus }}", "n": 3}, variables
    ) == {"p": "/opt/s/run", "port": 8000, "ids": [0, 1], "n": 3}
    with pytest.raises(RenderError, match="'missing' is undefined"):
        render({"p": "{{ missing }}/x"}, variables)
    with pytest.raises(RenderError, match="'missing' is undefined"):
        render("{{ missing }}", variables)
    with pytest.raises(RenderError, match="has no attribute 'host'"):
        render("{{ serve.host }}", variables)


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (None, True),
        (True, True),
        (False, False),
        ("{{ profile != 'cpu' }}", False),
        ("profile == 'cpu'", True),
        ("{{ gpus | length > 1 }}", True),
    ],
)
def test_when(when, expected) -> None:
    assert evaluate_when(when, {"profile": "cpu", "gpus": [0, 1]}) is expected


def test_when_undefined_is_an_error() -> None:
    with pytest.raises(RenderError, match="'nope' is undefined"):
        evaluate_when("{{ nope }}", {})
