"""Imports: weights made elsewhere (a file, or named torchvision weights) as a version."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, UploadFile, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from api.deps import RefsDep, SessionDep, SettingsDep, TrainCaller
from api.errors import TooLargeError, responses
from api.routers.model_registry import _committed, _version_out
from api.schemas import API_PREFIX, ImportIn, VersionOut
from core import artifacts, imports
from core.db.tables import Job
from core.errors import InvalidError
from core.settings import Settings
from training import weights

router = APIRouter(prefix="/registry", tags=["registry"])
PATH = "/{name}/versions/import"
FORM_BYTES = 2**20  # the form's fields and framing beside the file
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # tab and line breaks pass
Text = Annotated[str | None, Form()]


def is_import(path: str) -> bool:
    """Whether a request path is an import's (its body may be IMPORT_MAX_BYTES)."""
    return path.startswith(f"{API_PREFIX}{router.prefix}/") and path.endswith("/versions/import")


def body_limit(settings: Settings) -> int:
    """The body limit of an import: the file's, and room for the form's fields."""
    return settings.import_max_bytes + FORM_BYTES


@router.post(
    PATH,
    status_code=status.HTTP_201_CREATED,
    summary="Import weights from a file as the next version",
    responses=responses(401, 403, 413, 422, 503),
)
def import_version(
    name: str,
    session: SessionDep,
    settings: SettingsDep,
    refs: RefsDep,
    caller: TrainCaller,
    file: Annotated[UploadFile | None, File(description="The weights file.")] = None,
    architecture: Annotated[str | None, Form(description="A zoo name, e.g. resnet50.")] = None,
    options: Annotated[str | None, Form(description="The net's options (JSON).")] = None,
    classes: Annotated[str | None, Form(description="The class names (a JSON list).")] = None,
    preprocessing: Annotated[
        str | None, Form(description="crop, resize, interpolation, mean, std (JSON).")
    ] = None,
    format: Annotated[str, Form(description="auto, torchvision, akamaster, safetensors.")] = "auto",
    weights: Annotated[str | None, Form(description="torchvision weights by name.")] = None,
) -> VersionOut:
    """Read a torchvision `.pth` state dict, an akamaster CIFAR `.th` or a safetensors file
    (never unpickling code), load it into the zoo's `architecture` strictly (422 listing
    the first mismatched keys and shapes), compare torchvision's own net on a seeded batch
    where it has one, and register the converted checkpoint as `name`'s next version, owned
    by the caller's key. With ALLOW_DOWNLOADS, `weights` names torchvision weights instead
    of a file (e.g. ResNet50_Weights.IMAGENET1K_V2), with their transforms and categories.
    413 past IMPORT_MAX_BYTES."""
    asked = _form(
        architecture=architecture,
        options=_json("options", options),
        classes=_json("classes", classes),
        preprocessing=_json("preprocessing", preprocessing),
        format=format,
        weights=weights,
    )
    imports.check_target(session=session, name=name, caller=caller)
    request = imports.ImportRequest(
        name=name,
        architecture=asked.architecture or "",
        options=asked.options,
        classes=tuple(asked.classes) if asked.classes else None,
        preprocessing=asked.preprocessing.model_dump(exclude_none=True),
        format=asked.format,
        weights=asked.weights,
    )
    if asked.weights is not None:
        imported = imports.convert_named(request, settings)
    else:
        imported = _converted(file, request, settings)
    version = imports.store(
        session=session, settings=settings, request=request, imported=imported, caller=caller
    )
    _committed(session, refs)  # `name` now means this version
    job = session.get(Job, version.job_id)
    assert job is not None  # made just now
    return _version_out(version, job)


def _converted(
    file: UploadFile | None, request: imports.ImportRequest, settings: Settings
) -> weights.Imported:
    """The uploaded file received into a folder of the store's disk, and converted."""
    if file is None:
        raise InvalidError(
            "send the weights file (file), or name torchvision weights (weights)",
            field=("body", "file"),
        )
    if not request.architecture:
        raise InvalidError("architecture is needed, e.g. resnet18", field=("body", "architecture"))
    root = artifacts.root(settings)
    root.mkdir(parents=True, exist_ok=True)
    file_name = _CONTROL.sub("", Path(file.filename or "weights").name)[:200] or "weights"
    with tempfile.TemporaryDirectory(prefix=".import-", dir=root) as folder:
        path = Path(folder) / "weights"
        try:
            sha256 = imports.receive(file.file, path, settings.import_max_bytes)
        except imports.TooLargeFileError as error:
            raise TooLargeError(error.message) from None
        return imports.convert_file(path, request, file_name=file_name, sha256=sha256)


def _check_plain(field: str, value: Any) -> None:
    """422 when a form field's text (or any string in its JSON) holds a control character:
    the database keeps no NUL, and no name or class needs one."""
    if isinstance(value, str) and _CONTROL.search(value):
        raise InvalidError(
            f"{field} contains a control character (such as NUL); remove it",
            field=("body", field),
        )
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        _check_plain(field, key)
        _check_plain(field, item)


def _json(field: str, text: str | None) -> Any:
    """A form field's JSON, or 422 naming the field."""
    if text is None or not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidError(f"{field} is not JSON: {error}", field=("body", field)) from None


def _form(**fields: Any) -> ImportIn:
    """The form's fields validated, or 422 in the shape of every other validation error."""
    given = {key: value for key, value in fields.items() if value is not None}
    for key, value in given.items():
        _check_plain(key, value)
    try:
        return ImportIn.model_validate(given)
    except ValidationError as error:
        raise RequestValidationError(
            [{**item, "loc": ("body", *item["loc"])} for item in error.errors()]
        ) from None
