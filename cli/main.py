"""`resnet-service`: the command line. Every command is registered here, from its module.

- cli.local: `models`, `train`, `evaluate` (no service needed)
- cli.client: `submit`, `jobs`, `edit`, `watch`, `predict`, `predict-batch`, `export`,
  `import` (a running service, over HTTP)
- cli.study: `study presets|run|show` (the papers' experiments over seeds; a service, or --local)
- cli.keys: `keys create|list|revoke` (the service's database)
- cli.server: `migrate`, `worker`, `api`, `up` (running the service)
"""

from __future__ import annotations

import typer

from cli import client, keys, local, server, study

app = typer.Typer(help="Train, evaluate, compare and serve the ResNets of He et al.")


@app.callback()
def main() -> None:
    """Train, evaluate, compare and serve the ResNets of He et al. (2015, 2016)."""


app.command("models")(local.list_zoo)
app.command("train")(local.train)
app.command("evaluate")(local.evaluate)

app.command("submit")(client.submit)
app.command("jobs")(client.list_jobs)
app.command("edit")(client.edit)
app.command("watch")(client.watch)

keys_app = typer.Typer(help="API keys, written straight to the service's database.")
keys_app.command("create")(keys.create_key)
keys_app.command("list")(keys.list_keys)
keys_app.command("revoke")(keys.revoke_key)
app.add_typer(keys_app, name="keys")

app.command("predict")(client.predict)
app.command("predict-batch")(client.predict_batch)
app.command("export")(client.export)
app.command("import")(client.import_weights)

study_app = typer.Typer(help="Studies: the papers' experiments, or any grid, over seeds.")
study_app.command("presets")(study.list_presets)
study_app.command("run")(study.run)
study_app.command("show")(study.show)
app.add_typer(study_app, name="study")

app.command("migrate")(server.migrate)
app.command("worker")(server.worker)
app.command("api")(server.api)
app.command("up")(server.up)
