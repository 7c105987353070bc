"""Run the collection's AWX definitions (awx/) the way AWX runs them, without an AWX server.

* :func:`inject_credential` renders the ``zjusct.cloud`` credential type's injectors over sample inputs as AWX
  documents it for custom credential types: a sandboxed Jinja2 environment over the credential's inputs (empty
  inputs left out, missing booleans ``False``) plus ``tower.filename``; each ``file`` template is written to a
  private 0600 file under the job's ``env/`` directory, ``template.<id>`` giving ``tower.filename.<id>`` and a
  bare ``template`` giving ``tower.filename``; then the ``env`` and ``extra_vars`` templates are rendered; an
  environment variable named ``ANSIBLE_*`` is refused (AWX reserves them).
* :func:`launch_extra_vars` builds the job's extra vars as AWX does at launch: the template's extra vars, the
  survey answers checked against the survey (type, min/max, choices, required), survey defaults for unanswered
  questions, and the ``awx_*``/``tower_*`` variables AWX adds (``awx_user_name`` the launching user).
* :func:`run_job` hands all of it to ansible-runner (subprocess mode: no tty), and returns the runner's status, rc,
  stats and job events read from its artifacts directory.

Behaviour described from the AWX documentation ("Custom Credential Types", job template surveys); no AWX code.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
AWX_DIR = REPO / "awx"


class _AnsibleLoader(yaml.SafeLoader):
    """yaml.SafeLoader that reads Ansible's ``!unsafe`` tag as a plain string (as AWX receives it)."""


_AnsibleLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def load(name: str) -> Any:
    """Load ``awx/<name>`` (``!unsafe`` strings become plain strings)."""
    return yaml.load((AWX_DIR / name).read_text(), Loader=_AnsibleLoader)


def credential_type() -> dict[str, Any]:
    return load("credential_type.yml")["awx_credential_type"]


def job_template(playbook: str) -> dict[str, Any]:
    """The job template (awx/job_templates.yml) whose playbook is ``playbook`` (e.g. ``playbooks/vm_start.yml``)."""
    for jt in load("job_templates.yml")["awx_job_templates"]:
        if jt["playbook"] == playbook:
            return jt
    raise KeyError(playbook)


class _Namespace:
    """Attribute bag for ``tower`` / ``tower.filename`` in the injector templates."""


@dataclass
class Injected:
    env: dict[str, str]
    extra_vars: dict[str, Any]
    files: dict[str, Path]
    extra_vars_file: Path | None = None
    secrets: list[str] = field(default_factory=list)


def inject_credential(ctype: dict[str, Any], inputs: dict[str, Any], private_data_dir: Path) -> Injected:
    """Render ``ctype``'s injectors over ``inputs`` into ``private_data_dir/env`` (see the module docstring).

    Returns:
        The environment and extra vars to set, the files written, and the secret input values (to search the
        output for).

    Raises:
        ValueError: an injector sets an ``ANSIBLE_*`` environment variable.
    """
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    fields = ctype["inputs"].get("fields", [])
    tower = _Namespace()
    namespace: dict[str, Any] = {"tower": tower}
    secrets = []
    for fdef in fields:
        value = inputs.get(fdef["id"])
        if fdef.get("type") == "boolean":
            namespace[fdef["id"]] = bool(value)
            continue
        if value is None or value == "":
            continue
        namespace[fdef["id"]] = value
        if fdef.get("secret"):
            secrets.append(str(value))
    sandbox = ImmutableSandboxedEnvironment()
    env_dir = private_data_dir / "env"
    env_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for label, tmpl in ctype["injectors"].get("file", {}).items():
        fd, name = tempfile.mkstemp(dir=env_dir)
        with os.fdopen(fd, "w") as fh:
            fh.write(sandbox.from_string(tmpl).render(**namespace))
        os.chmod(name, stat.S_IRUSR | stat.S_IWUSR)
        files[label] = Path(name)
        if "." not in label:
            tower.filename = name  # type: ignore[attr-defined]
        else:
            if not hasattr(tower, "filename"):
                tower.filename = _Namespace()  # type: ignore[attr-defined]
            setattr(tower.filename, label.split(".", 1)[1], name)  # type: ignore[attr-defined]
    env: dict[str, str] = {}
    for var, tmpl in ctype["injectors"].get("env", {}).items():
        if var.upper().startswith("ANSIBLE_"):
            raise ValueError(f"injectors.env: {var} is reserved by AWX (ANSIBLE_*)")
        env[var] = sandbox.from_string(tmpl).render(**namespace)

    def render(node: Any) -> Any:
        if isinstance(node, str):
            return sandbox.from_string(node).render(**namespace)
        if isinstance(node, list):
            return [render(n) for n in node]
        if isinstance(node, dict):
            return {render(k): render(v) for k, v in node.items()}
        return node

    extra_vars = render(ctype["injectors"].get("extra_vars", {}))
    extra_file = None
    if extra_vars:
        fd, name = tempfile.mkstemp(dir=env_dir, suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(extra_vars, fh)
        extra_file = Path(name)
    return Injected(env, extra_vars, files, extra_file, secrets)


def check_answers(survey: dict[str, Any], answers: dict[str, Any]) -> dict[str, Any]:
    """The survey's variables for ``answers`` as AWX accepts them at launch.

    Unanswered questions take their default (an empty default of an optional question is left out); an answer
    must have the question's type and lie within min/max (lengths for text) or choices.

    Raises:
        ValueError: naming the variable, the value and the survey's limit (AWX refuses the launch with HTTP 400).
        KeyError: an answer for a variable the survey does not ask (AWX drops it without "prompt on launch").
    """
    out: dict[str, Any] = {}
    questions = {q["variable"]: q for q in survey["spec"]}
    for var in answers:
        if var not in questions:
            raise KeyError(f"{var}: not a survey question and variables are not prompted on launch")
    for var, q in questions.items():
        if var not in answers:
            if q["required"] and q.get("default") in (None, ""):
                raise ValueError(f"{var}: required")
            if q.get("default") not in (None, ""):
                out[var] = q["default"]
            continue
        value = answers[var]
        if q["type"] == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{var}: {value!r} is not an integer")
            if ("min" in q and value < q["min"]) or ("max" in q and value > q["max"]):
                raise ValueError(f"{var}: {value} is outside {q['min']} to {q['max']}")
        elif q["type"] in ("text", "textarea", "password"):
            if not isinstance(value, str):
                raise ValueError(f"{var}: {value!r} is not a string")
            if value and (("min" in q and len(value) < q["min"]) or ("max" in q and len(value) > q["max"])):
                raise ValueError(f"{var}: length {len(value)} is outside {q['min']} to {q['max']} characters")
        elif q["type"] == "multiplechoice":
            if value not in q["choices"]:
                raise ValueError(f"{var}: {value!r} is not one of {q['choices']}")
        out[var] = value
    return out


def launch_extra_vars(jt: dict[str, Any], answers: dict[str, Any], user: str,
                      template_vars: dict[str, Any] | None = None, job_id: int = 1) -> dict[str, Any]:
    """The extra vars AWX passes to the job of template ``jt`` launched by ``user`` with survey ``answers``."""
    awx = {
        "job_id": job_id, "job_launch_type": "manual", "job_template_id": 7, "job_template_name": jt["name"],
        "project_revision": "0" * 40, "project_scm_branch": "main", "inventory_id": 1,
        "inventory_name": "zjusct.cloud hypervisors", "execution_node": "awx-task", "host": "https://awx.example",
        "user_id": 42, "user_name": user, "user_email": f"{user}@example.org", "user_first_name": user,
        "user_last_name": "",
    }
    out = dict(template_vars or {})
    out.update(check_answers(jt["survey_spec"], answers))
    for key, value in awx.items():
        out[f"awx_{key}"] = value
        out[f"tower_{key}"] = value
    return out


@dataclass
class Job:
    status: str
    rc: int
    stats: dict[str, Any]
    events: list[dict[str, Any]]
    stdout: str

    def failed_messages(self) -> list[str]:
        return [str(e["event_data"].get("res", {}).get("msg", "")) for e in self.events
                if e.get("event") == "runner_on_failed"]

    def task_results(self, task: str) -> list[dict[str, Any]]:
        """The ``res`` of every runner_on_ok / runner_on_failed event of the task named ``task``."""
        return [e["event_data"]["res"] for e in self.events
                if e.get("event") in ("runner_on_ok", "runner_on_failed") and e["event_data"].get("task") == task]


def run_job(private_data_dir: Path, playbook: str, extra_vars: dict[str, Any], injected: Injected,
            inventory: str, env: dict[str, str] | None = None, verbosity: int = 0, timeout: int = 3000) -> Job:
    """Run ``playbook`` of the repository through ansible-runner as an AWX job (no tty, events in artifacts)."""
    from ansible_runner import Runner, RunnerConfig

    envvars = dict(env or {})
    envvars.update(injected.env)
    cmdline = f"-e @{injected.extra_vars_file}" if injected.extra_vars_file else None
    config = RunnerConfig(
        private_data_dir=str(private_data_dir), project_dir=str(REPO), playbook=playbook, inventory=inventory,
        extravars=extra_vars, envvars=envvars, cmdline=cmdline, verbosity=verbosity, quiet=True, timeout=timeout,
        ident=f"job{extra_vars.get('awx_job_id', 1)}-{uuid.uuid4().hex[:6]}")
    config.prepare()
    # No tty: ansible-playbook runs as a plain subprocess with stdin from /dev/null and stdout/stderr piped
    # (RunnerConfig's default is a pexpect pty); events still come from runner's callback into the artifacts.
    config.runner_mode = "subprocess"
    with open(os.devnull) as devnull:
        config.input_fd = devnull
        runner = Runner(config=config)
        runner.run()
    events = list(runner.events)
    stdout = runner.stdout.read()
    return Job(runner.status, runner.rc, runner.stats or {}, events, stdout)
