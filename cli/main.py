"""`resnet-service`: the command line. Every command is registered here, from its module.

- cli.local: `models`, `train`, `evaluate` (no service needed)
- cli.client: `submit`, `jobs`, `edit`, `watch`, `cancel`, `retry`, `delete`, `register`,
  `download`, `workers`, `predict`, `predict-batch`, `export`, `import` (a running service,
  over HTTP)
- cli.models: `alias`, `promote`, `history` (a model's rollout between its versions, over
  HTTP)
- cli.study: `study presets|run|show|extend` (the papers' experiments over seeds, searches;
  a service, or --local)
- cli.keys: `keys create|list|revoke` (the service's database)
- cli.server: `migrate`, `worker`, `api`, `up` (running the service)
"""

from __future__ import annotations

from collections.abc import Callable

import typer

from cli import client, keys, local, models, server, study

app = typer.Typer(help="Train, evaluate, compare and serve the ResNets of He et al.")


@app.callback()
def main() -> None:
    """Train, evaluate, compare and serve the ResNets of He et al. (2015, 2016)."""


def _group(name: str, about: str, commands: dict[str, Callable[..., None]]) -> None:
    """A command group (`resnet-service NAME ...`) of these commands, by name."""
    group = typer.Typer(help=about)
    for command, function in commands.items():
        group.command(command)(function)
    app.add_typer(group, name=name)


# Typer lists the commands in this order, then the groups.
COMMANDS: dict[str, Callable[..., None]] = {
    "models": local.list_zoo,
    "train": local.train,
    "evaluate": local.evaluate,
    "submit": client.submit,
    "jobs": client.list_jobs,
    "edit": client.edit,
    "watch": client.watch,
    "cancel": client.cancel,
    "retry": client.retry,
    "delete": client.delete,
    "register": client.register,
    "download": client.download,
    "workers": client.workers,
    "predict": client.predict,
    "predict-batch": client.predict_batch,
    "export": client.export,
    "import": client.import_weights,
    "alias": models.alias,
    "promote": models.promote,
    "history": models.history,
    "migrate": server.migrate,
    "worker": server.worker,
    "api": server.api,
    "up": server.up,
}
for name, function in COMMANDS.items():
    app.command(name)(function)
_group(
    "keys",
    "API keys, written straight to the service's database.",
    {"create": keys.create_key, "list": keys.list_keys, "revoke": keys.revoke_key},
)
_group(
    "study",
    "Studies: the papers' experiments, or any grid, over seeds.",
    {"presets": study.list_presets, "run": study.run, "show": study.show, "extend": study.extend},
)
