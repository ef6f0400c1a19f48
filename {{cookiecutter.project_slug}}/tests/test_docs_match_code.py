"""The README and docs/ say what this project's code does: every flag, config key and value,
make target and variable, project path and sharding rule a page names is one the code takes.

Where claims come from (tests/docs_claims.py): the lines of bash blocks (continuations joined,
comments dropped), TOML blocks, and inline code. Inline code that starts with a program (the
console script, `python`, `make`, a script of the project, another's tool) is a command line;
inline code that starts with one of the project's commands (`eval --checkpoint`) names that
command: its subcommands and options must exist, nothing more is asked of it. Inline code
shows a command's start at times: an option left without its value at its end is not a
failure there, nor a `--set` without `=`. A section whose heading says it shows what is not
offered or refused holds only its paths: its commands and values are there to be refused.

How each kind is held (tests/docs_checks.py, docs_project.py, makefile_facts.py):
- flags: the console script's and `python -m <package>`'s words walk the Typer app's click
  command tree; every option named must be the command's, then click parses the words (the
  command never runs): a missing required option or a refused value fails. A command that
  reaches a TPU is held to the pod launcher's own check of its target (`make_target`: --tpu,
  --zone). After `--`, `pod train` and `spot task` hand the words to `train`; `pod run`,
  `xpk ... --command` and `gcloud ... --command` run theirs as a shell line; `docker run
  $IMAGE` hands its words to the image's entrypoint, the CLI. `python benchmarks/x.py` goes
  through the script's own argparse `parser()`. The flags of the tools in OTHERS
  (docs_checks.py) are theirs; any other program in a bash block or a nested line fails.
- config: `--set` pairs and a command's config flags (`--strategy`, `--mesh`, ...) over its
  `--config` file (one the page has the reader write is left out), TOML blocks, and inline
  `key = value` whose key is a config key: built by the project's `build_config` and
  validated as a run does, then the mesh (`parse_mesh`), the strategy (`core.strategies`)
  and the task options (the example task built with them). A local `data` path is a
  run-time path; a refusal that only asks for an extra this environment lacks is not one.
- make: each target named is the Makefile's; each VAR=value is read by the targets named
  (their recipes, prerequisites, and the variables those use); with ARGS, `make -n` expands
  the targets (not one that runs make itself) and the command carrying ARGS is checked.
- paths: a word of a bash line or of inline code is a project path when it starts with a
  folder of the project (src/ tests/ benchmarks/ configs/ scripts/ docs/) or of its package
  (core/ training/ hf/ data/ weights/ planning/ pod/ spot/ goodput/ tasks/, under
  src/<package>/, and only when it ends in a file suffix or `/`: `data/corpus` is an
  output), or is a file name ending in .py or .sh (found anywhere in the project), or one of
  Makefile, Dockerfile, pyproject.toml, README.md, .pre-commit-config.yaml. Never inside a
  URL (gs://...), an absolute or home path (/opt/..., ~/...), runs/..., .venv, .sky/..., or
  after `$VAR/`; a file the page has the reader write (`my-task.toml`, `my_task.py`,
  `mine.toml`) or a stand-in (`TPU_NAME-S/...`) is not the project's.
- rules: every sharding rule shown (`sharding_rules` in TOML, inline, `--set`) parses with the
  project's `parse_rules` and matches, by its `Rule.matches`, a parameter of the model its
  config trains, built as `plan` builds it: on the meta device.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from docs_checks import Report, check_page
from docs_project import Project
from readme_inventory import PROJECT, documentation

PAGES = documentation()
IDS = [page.relative_to(PROJECT).as_posix() for page in PAGES]
REPORTS: dict[Path, Report] = {}


@pytest.fixture(scope="module")
def project() -> Project:
    """This project, its command line and config imported once for every page."""
    return Project(PROJECT)


def report_of(project: Project, page: Path) -> Report:
    """Every claim of the page held against the code, once per page."""
    if page not in REPORTS:
        REPORTS[page] = check_page(project, page.read_text(), page.relative_to(PROJECT).as_posix())
    return REPORTS[page]


def held(project: Project, page: Path, kind: str) -> None:
    """Fail with every claim of that kind the code refuses, one a line."""
    failures = report_of(project, page).of(kind)
    if failures:
        pytest.fail("\n".join(str(failure) for failure in failures), pytrace=False)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_command_and_flag_is_one_the_code_takes(project: Project, page: Path) -> None:
    """It finds each program, subcommand and flag the page shows, and each required option."""
    held(project, page, "flags")


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_config_key_and_value_is_one_the_config_accepts(project: Project, page: Path) -> None:
    """It builds and validates the config of every --set, config flag and TOML fragment."""
    held(project, page, "config")


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_make_target_and_variable_is_the_makefiles(project: Project, page: Path) -> None:
    """It finds each make target named in the Makefile, and each VAR=value read by it."""
    held(project, page, "make")


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_project_path_is_a_file_of_the_project(project: Project, page: Path) -> None:
    """It finds in the project each file and folder of it the page names."""
    held(project, page, "paths")


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_sharding_rule_matches_a_parameter_of_the_model(project: Project, page: Path) -> None:
    """It matches each sharding rule shown to a parameter of the model its config trains."""
    held(project, page, "rules")


def test_the_docs_name_claims_of_every_kind_it_holds(project: Project) -> None:
    """It counts the flags, keys, targets, variables, paths and rules it held (`-s` prints)."""
    total: Counter[str] = Counter()
    for page in PAGES:
        total.update(report_of(project, page).counts)
    print("docs checked against the code:", ", ".join(f"{n} {k}" for k, n in sorted(total.items())))
    for kind in ("commands", "flags", "keys", "targets", "paths"):
        assert total[kind] > 0, f"no {kind} found in the docs: is the checker reading them?"


# The checker itself: a small page with one wrong claim of each kind, and one of true claims.


def claims(project: Project, markdown: str, kind: str) -> list[str]:
    """`item: why` of each failure of that kind in a page written here."""
    failures = check_page(project, markdown, "synthetic.md").of(kind)
    return [f"{failure.item}: {failure.why}" for failure in failures]


def bash(*lines: str) -> str:
    return "```bash\n" + "\n".join(lines) + "\n```\n"


def example_config(project: Project) -> str:
    return f"configs/{project.config_module.TrainConfig().task}.toml"


def test_a_flag_its_command_does_not_take_is_reported(project: Project) -> None:
    """It reports a flag of the CLI, and one of a benchmark script, that neither takes."""
    page = bash(f"{project.slug} train --max-steps 5 --no-such-flag", "make bench ARGS='--nope'")
    found = claims(project, page, "flags")
    assert len(found) == 2, found
    assert found[0].startswith(f"{project.slug} train --no-such-flag:"), found
    assert "--nope" in found[1], found


def test_a_subcommand_the_cli_lacks_is_reported(project: Project) -> None:
    """It reports a subcommand that the command tree does not have."""
    found = claims(project, f"Run `{project.slug} pod launch --tpu x`.", "flags")
    assert [item.split(":")[0] for item in found] == [f"{project.slug} pod launch"], found


def test_an_unknown_program_is_reported(project: Project) -> None:
    """It reports a bash line, or a command another tool runs, whose program nobody ships."""
    page = bash(f"{project.package} train", 'xpk workload create --command "look_hf train"')
    found = claims(project, page, "flags")
    assert [item.split(":")[0] for item in found] == [project.package, "look_hf"], found


def test_a_missing_required_option_is_reported(project: Project) -> None:
    """It reports a command without an option click requires, or the pod launcher does."""
    page = bash(f"{project.slug} export --out model.safetensors", f'{project.slug} pod run -- "ls"')
    found = claims(project, page, "flags")
    assert len(found) == 2, found
    assert "--checkpoint" in found[0] and "--tpu" in found[1], found


def test_an_unknown_config_key_is_reported(project: Project) -> None:
    """It reports a config key the config does not have, in --set and in a TOML block."""
    page = bash(f"{project.slug} train --set no_such_key=1") + "```toml\nbatch_sise = 4\n```\n"
    found = claims(project, page, "config")
    assert len(found) == 2 and "no_such_key" in found[0] and "batch_sise" in found[1], found


def test_a_value_the_config_refuses_is_reported(project: Project) -> None:
    """It reports a value that the config's own validation refuses."""
    page = bash(f"{project.slug} train --set lr=-1", f"{project.slug} train --mesh fsdp=4,rows=2")
    found = claims(project, page, "config")
    assert len(found) == 2 and "lr" in found[0] and "rows" in found[1], found


def test_a_missing_make_target_is_reported(project: Project) -> None:
    """It reports a make target the Makefile lacks, in a bash line and in inline code."""
    page = bash("make no-such-target") + "Then `make train-everything`."
    found = claims(project, page, "make")
    items = [item.split(":")[0] for item in found]
    assert items == ["make no-such-target", "make train-everything"], found


def test_a_variable_its_target_never_reads_is_reported(project: Project) -> None:
    """It reports VAR=value on a make line whose targets never read VAR."""
    found = claims(project, "Pick another TPU: `make train-8 TPU_NAME=other`.", "make")
    assert found == ["TPU_NAME=: make train-8 never reads TPU_NAME"], found


def test_a_missing_path_is_reported(project: Project) -> None:
    """It reports a path into the project, and a file name, that the project does not have."""
    page = f"See `src/{project.package}/core/no_such_module.py` and `no_such_script.sh`."
    found = claims(project, page, "paths")
    assert [item.split(":")[0] for item in found] == [
        f"src/{project.package}/core/no_such_module.py",
        "no_such_script.sh",
    ], found


def test_a_rule_that_matches_no_parameter_is_reported(project: Project) -> None:
    """It reports a sharding rule that names no parameter of the example's model."""
    page = '```toml\nsharding_rules = [["no_such_layer.weight", ["tensor", "fsdp"]]]\n```\n'
    found = claims(project, page, "rules")
    assert len(found) == 1 and found[0].startswith("no_such_layer.weight: matches no"), found


def test_a_section_of_what_is_refused_holds_only_its_paths(project: Project) -> None:
    """It does not hold as taken what a section on what is not offered shows refused."""
    page = (
        "## Not offered on this backend\n\n| refused | instead |\n| --- | --- |\n"
        f'| `{project.slug} train --no-such-flag` | `strategy = "nowhere"` |\n'
        f"| `src/{project.package}/no_such_module.py` | `make no-such-target` |\n"
    )
    report = check_page(project, page, "synthetic.md")
    assert [(failure.kind, failure.item) for failure in report.failures] == [
        ("paths", f"src/{project.package}/no_such_module.py")
    ], report.failures


def test_a_page_of_true_claims_reports_nothing(project: Project) -> None:
    """It finds no failure in claims the code takes: placeholders, prefixes and others' tools."""
    config = example_config(project)
    names = project.parameter_names(project.config_module.build_config(Path(config), {}))
    assert names
    page = bash(
        f"{project.slug} train --config {config} -s lr=1e-3 --max-steps N --mesh fsdp=8",
        f"{project.slug} pod train --tpu NAME --zone ZONE -- --max-steps 5",
        f"make train-single ARGS='--config {config} --max-steps 10'",
        "make train-pod SLICES=2 DRY_RUN=1",
        "make bench ARGS='--out runs/b'",
        f"python -m {project.package} goodput gs://my-bucket/runs/week1",
        f'gcloud compute tpus tpu-vm ssh NAME --worker=all --command "{project.slug} doctor"',
        'docker run --rm -e PJRT_DEVICE=CPU "$IMAGE" train --max-steps 20',
        "IMAGE=registry/image && pip install -e '.[wandb]'",
    ) + (
        f"Inline: `{project.slug} train --config {config} --data`, `eval --checkpoint`, "
        f"`{project.slug} pod run|sync|kill`, `--set KEY=VALUE`, `make ... ZONE=...`, "
        f"`src/{project.package}/cli.py`, `core/sharding.py`, `configs/my-task.toml`, "
        f"`runs/default/summary.json`, `data/corpus`, `gs://bucket/x.py`, `Makefile`.\n"
        f'```toml\nlr = 1e-3\nsharding_rules = [["{names[-1]}", ["fsdp"]]]\n```\n'
    )
    report = check_page(project, page, "synthetic.md")
    assert not report.failures, "\n".join(map(str, report.failures))
    assert report.counts["rules"] == 1 and report.counts["paths"] == 6, report.counts
