"""The client's answer types held against the service's OpenAPI schema: a field the server
sends that the client lacks, one the client expects that the server does not send, a type
or an enumeration that differ, each fails here (and the last tests show that they do)."""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from typing import Any, Literal, NotRequired, Union, get_args, get_origin, get_type_hints

import pytest
from typing_extensions import is_typeddict

from client import errors, models, wire
from core.settings import Settings

Schema = dict[str, Any]

# What the client parses, by route: the type it reads each answer as.
ANSWERS: dict[tuple[str, str], Any] = {
    ("post", "/jobs"): models.Job,
    ("get", "/jobs"): models.JobPage,
    ("get", "/jobs/kinds"): list[models.Kind],
    ("get", "/jobs/{job_id}"): models.Job,
    ("patch", "/jobs/{job_id}"): models.Job,
    ("post", "/jobs/{job_id}/cancel"): models.Job,
    ("post", "/jobs/{job_id}/retry"): models.Retried,
    ("get", "/jobs/{job_id}/metrics"): models.Metrics,
    ("get", "/jobs/{job_id}/checkpoints"): list[models.Checkpoint],
    ("get", "/jobs/{job_id}/artifacts"): list[models.Artifact],
    ("post", "/studies"): models.Study | models.StudyPreview,  # the preview with dry_run
    ("get", "/studies"): list[models.StudyItem],
    ("get", "/studies/presets"): list[models.Preset],
    ("get", "/studies/{study_id}"): models.Study,
    ("post", "/studies/{study_id}/cancel"): models.Study,
    ("get", "/studies/{study_id}/compare"): models.StudyComparisons,
    ("get", "/studies/{study_id}/plan"): models.StudyPlan,
    ("get", "/studies/{study_id}/trials"): models.StudyTrials,
    ("get", "/registry"): models.RegistryPage,
    ("get", "/registry/{name}"): models.RegisteredModel,
    ("post", "/registry/{name}/versions"): models.Version,
    ("post", "/registry/{name}/versions/import"): models.Version,
    ("put", "/registry/{name}/aliases/{alias}"): models.Alias,
    ("post", "/registry/{name}/aliases/{alias}/promote"): models.Alias,
    ("get", "/registry/{name}/history"): list[models.HistoryEntry],
    ("get", "/registry/{name}/shadow"): list[models.ShadowComparison],
    ("post", "/registry/{name}/versions/{version}/exports"): models.Export,
    ("get", "/registry/{name}/versions/{version}/exports"): list[models.Export],
    ("get", "/registry/{name}/versions/{version}/payloads"): models.PayloadPage,
    ("get", "/registry/{name}/versions/{version}/drift"): models.Drift,
    ("get", "/jobs/{job_id}/payloads"): models.PayloadPage,
    ("get", "/jobs/{job_id}/drift"): models.Drift,
    ("post", "/predict"): models.Prediction,
    ("post", "/explain"): models.Explanation,
    ("get", "/healthz"): models.Health,
    ("get", "/readyz"): models.Ready,
    ("get", "/whoami"): models.Session,
    ("get", "/workers"): list[models.Worker],
}
ERROR_SHAPE = "ErrorOut"  # every error answer's schema, which `client.errors` parses


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> Schema:
    """The service's OpenAPI schema (the app is built, never served: no database is used)."""
    from api.app import create_app  # here: the client's other tests need no server code

    root = tmp_path_factory.mktemp("contract")
    settings = Settings(
        database_url=f"sqlite:///{root / 'unused.db'}",
        artifact_dir=root / "artifacts",
        data_dir=root / "data",
    )
    return create_app(settings).openapi()


def answer_schema(openapi: Schema, verb: str, path: str) -> Schema:
    """The JSON schema of a route's success answers (one, or anyOf them where they differ)."""
    route = openapi["paths"].get(wire.API_PREFIX + path, {}).get(verb)
    assert route is not None, f"{verb.upper()} {path}: no such route in the service's schema"
    found: list[Schema] = []
    for status, answer in route["responses"].items():
        schema = answer.get("content", {}).get("application/json", {}).get("schema")
        if status.startswith("2") and schema:
            options = schema.get("anyOf", [schema])
            found += [option for option in options if option not in found]
    assert found, f"{verb.upper()} {path}: no JSON answer in the service's schema"
    return found[0] if len(found) == 1 else {"anyOf": found}


class Drift:
    """The differences between the client's types and the schemas they read."""

    def __init__(self, components: dict[str, Schema]) -> None:
        self.components = components
        self.found: list[str] = []
        self.paired: dict[type, str] = {}  # each client type and the component it reads

    def check(self, where: str, annotation: Any, schema: Schema) -> list[str]:
        """Compare one type with one schema; every difference found so far."""
        self._fits(where, annotation, schema)
        return self.found

    def _fits(self, where: str, annotation: Any, schema: Schema) -> None:
        if annotation is Any or _free(schema):
            return  # the client takes anything, or the server declares nothing to compare
        if "$ref" in schema:
            self._component(where, annotation, schema["$ref"].rpartition("/")[2])
        elif "anyOf" in schema or _is_union(annotation):
            self._union(where, annotation, schema.get("anyOf", [schema]))
        elif "enum" in schema or "const" in schema:
            self._words(where, annotation, schema)
        elif schema.get("type") == "array":
            self._container(where, annotation, list, [schema.get("items", {})])
        elif schema.get("type") == "object":
            values = schema.get("additionalProperties", {})
            self._container(where, annotation, dict, [{"type": "string"}, _schema_of(values)])
        elif PRIMITIVES.get(schema.get("type", "")) is not annotation:
            self.found.append(
                f"{where}: the client reads {_name(annotation)}, the server sends {schema}"
            )

    def _component(self, where: str, annotation: Any, name: str) -> None:
        if not is_typeddict(annotation):
            self.found.append(
                f"{where}: the server sends {name}, the client reads {_name(annotation)}"
            )
            return
        if annotation not in self.paired:
            self.paired[annotation] = name
            self._fields(annotation, self.components[name])
        elif self.paired[annotation] != name:
            self.found.append(
                f"{where}: {annotation.__name__} reads {name} and {self.paired[annotation]}"
            )

    def _fields(self, cls: type, schema: Schema) -> None:
        """A typed dictionary's keys against an object's properties, each both ways."""
        hints = get_type_hints(cls, include_extras=True)  # NotRequired[...] kept
        sent = schema.get("properties", {})
        always = set(schema.get("required", []))
        for key in sorted(sent.keys() - hints.keys()):
            self.found.append(f"{cls.__name__}.{key}: sent by the server, missing in the client")
        for key in sorted(hints.keys() - sent.keys()):
            self.found.append(
                f"{cls.__name__}.{key}: expected by the client, not sent by the server"
            )
        for key in sorted(sent.keys() & hints.keys()):
            optional = get_origin(hints[key]) is NotRequired
            if optional == (key in always):
                say = "required" if key in always else "optional (NotRequired)"
                self.found.append(f"{cls.__name__}.{key}: the server's schema has it {say}")
            annotation = get_args(hints[key])[0] if optional else hints[key]
            self._fits(f"{cls.__name__}.{key}", annotation, sent[key])

    def _union(self, where: str, annotation: Any, options: list[Schema]) -> None:
        """Each alternative of the schema read by one of the type's, and the type's null only
        where the schema has one."""
        mine = list(get_args(annotation)) if _is_union(annotation) else [annotation]
        nullable = {"type": "null"} in options
        if nullable != (type(None) in mine):
            self.found.append(
                f"{where}: null {'is' if nullable else 'is not'} sent, the client says otherwise"
            )
        mine = [option for option in mine if option is not type(None)]
        theirs = [option for option in options if option != {"type": "null"}]
        if len(mine) == len(theirs) == 1:
            self._fits(where, mine[0], theirs[0])
            return
        read = []
        for option in theirs:  # each read by the type's alternative it differs least from
            best = min(mine, key=lambda candidate: len(self._quiet(where, candidate, option)))
            self._fits(where, best, option)
            read.append(best)
        for candidate in mine:
            if candidate not in read:
                self.found.append(f"{where}: the client reads {_name(candidate)}, never sent")

    def _quiet(self, where: str, annotation: Any, schema: Schema) -> list[str]:
        """The differences of one alternative, found apart from the rest."""
        trial = Drift(self.components)
        trial.paired = dict(self.paired)
        return trial.check(where, annotation, schema)

    def _words(self, where: str, annotation: Any, schema: Schema) -> None:
        """An enumeration: the client reads it as text, or as the same Literal."""
        words = set(schema.get("enum", [schema.get("const")]))
        if annotation is str:
            return
        if get_origin(annotation) is not Literal or set(get_args(annotation)) != words:
            reads = _name(annotation)
            self.found.append(f"{where}: the server sends one of {sorted(words)}, not {reads}")

    def _container(self, where: str, annotation: Any, kind: type, parts: list[Schema]) -> None:
        if get_origin(annotation) is not kind:
            self.found.append(
                f"{where}: the server sends a {kind.__name__}, the client reads {_name(annotation)}"
            )
            return
        for index, (inner, part) in enumerate(zip(get_args(annotation), parts, strict=True)):
            self._fits(f"{where}[{index if kind is dict else ''}]", inner, part)


PRIMITIVES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}


def _free(schema: Schema) -> bool:
    """An object or value the server declares nothing of (`dict[str, Any]`, `Any`)."""
    if not schema or schema == {"additionalProperties": True, "type": "object"}:
        return True
    return (
        schema.get("type") == "object"
        and not {"properties", "additionalProperties"} & schema.keys()
    )


def _schema_of(values: Schema | bool) -> Schema:
    return {} if values is True else values if isinstance(values, dict) else {}


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)


def drift(openapi: Schema) -> tuple[list[str], dict[type, str]]:
    """Every difference between the client's answer types and the service's schema, and the
    component each client type was found to read."""
    found = Drift(openapi["components"]["schemas"])
    for (verb, path), annotation in ANSWERS.items():
        found.check(f"{verb.upper()} {path}", annotation, answer_schema(openapi, verb, path))
    error = {"$ref": f"#/components/schemas/{ERROR_SHAPE}"}
    found.check("an error answer", models.ErrorOut, error)
    return found.found, found.paired


def test_every_answer_the_client_reads_is_what_the_service_sends(openapi: Schema) -> None:
    assert drift(openapi)[0] == []


def test_every_answer_type_of_the_client_is_held_against_the_schema(openapi: Schema) -> None:
    declared = {value for value in vars(models).values() if is_typeddict(value)}
    paired = drift(openapi)[1]
    assert sorted(cls.__name__ for cls in declared - paired.keys()) == []


def test_every_error_status_the_service_documents_has_its_exception(openapi: Schema) -> None:
    statuses = {
        int(status)
        for route in openapi["paths"].values()
        for operation in route.values()
        for status in operation["responses"]
        if status.isdigit() and int(status) >= 400
    }
    assert sorted(statuses - errors.BY_STATUS.keys()) == []
    for status, cls in errors.BY_STATUS.items():
        assert cls.status_code == status
        assert issubclass(cls, errors.ApiError)


def test_the_service_speaks_the_clients_words(openapi: Schema) -> None:
    from core.db import tables
    from core.keys import SCOPES
    from training.export import FORMATS

    components = openapi["components"]["schemas"]
    assert components["JobItem"]["properties"]["status"]["enum"] == list(wire.JOB_STATUSES)
    assert components["KeyIn"]["properties"]["scopes"]["items"]["enum"] == list(wire.SCOPES)
    assert components["ExportIn"]["properties"]["format"]["enum"] == list(wire.EXPORT_FORMATS)
    assert (tables.JOB_STATUSES, tables.FINAL_STATUSES) == (wire.JOB_STATUSES, wire.FINAL_STATUSES)
    assert set(wire.ACTIVE_STATUSES) | set(wire.FINAL_STATUSES) == set(wire.JOB_STATUSES)
    assert (SCOPES, FORMATS) == (wire.SCOPES, wire.EXPORT_FORMATS)
    assert all(path.startswith((wire.API_PREFIX + "/", "/v2")) for path in openapi["paths"])


# -- the check fails where the two sides differ ----------------------------------------


def _added_field(schemas: dict[str, Schema]) -> None:
    schemas["JobItem"]["properties"]["priority"] = {"type": "integer"}
    schemas["JobItem"]["required"].append("priority")


def _removed_field(schemas: dict[str, Schema]) -> None:
    del schemas["Preprocessing"]["properties"]["interpolation"]
    schemas["Preprocessing"]["required"].remove("interpolation")


def _retyped_field(schemas: dict[str, Schema]) -> None:
    schemas["CheckpointOut"]["properties"]["step"] = {"type": "string"}


def _nullable_field(schemas: dict[str, Schema]) -> None:
    schemas["JobProgress"]["properties"]["step"] = {
        "anyOf": [{"type": "integer"}, {"type": "null"}]
    }


def _new_status(schemas: dict[str, Schema]) -> None:
    schemas["JobItem"]["properties"]["status"]["enum"].append("paused")


def _optional_field(schemas: dict[str, Schema]) -> None:
    schemas["ServedModel"]["required"].remove("sha256")


def _nested_field(schemas: dict[str, Schema]) -> None:
    schemas["ErrorDetail"]["properties"]["type"] = {"type": "string"}


CHANGES: dict[str, tuple[Callable[[dict[str, Schema]], None], str]] = {
    "added": (_added_field, "JobItem.priority: sent by the server, missing in the client"),
    "removed": (_removed_field, "Preprocessing.interpolation: expected by the client, not sent"),
    "retyped": (_retyped_field, "Checkpoint.step: the client reads int, the server sends"),
    "nullable": (_nullable_field, "JobProgress.step: null is sent"),
    "enumeration": (_new_status, "JobItem.status: the server sends one of ['cancelled', "),
    "optional": (_optional_field, "ServedModel.sha256: the server's schema has it optional"),
    "nested": (_nested_field, "ErrorDetail.type: sent by the server, missing in the client"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_server_that_changed_its_answers_fails_the_check(openapi: Schema, change: str) -> None:
    changed = copy.deepcopy(openapi)
    alter, expected = CHANGES[change]
    alter(changed["components"]["schemas"])
    found = drift(changed)[0]
    assert len(found) == 1, found
    assert found[0].startswith(expected), found
