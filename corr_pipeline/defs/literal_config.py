"""Run config holds values, never ``{env: VAR}``: the launchpad's fields take literals only.

Dagster gives every ``int``, ``str`` and ``bool`` field of a Pythonic resource or ``Config``
the *source* types ``IntSource`` / ``StringSource`` / ``BoolSource``, which also accept
``{env: VAR}`` and read that variable in the run worker. A run config is written by anyone who
can open the launchpad, and the run worker's environment holds the deployment's secrets
(``$CORR_PIPELINE_DATABASE_URL`` and its password): a field that reads one would carry it into
a value, and from there into a message of the run's event log. :func:`literal_field` turns
such a schema into the same schema with plain ``Int`` / ``String`` / ``Bool`` (defaults,
descriptions and optionality kept), so Dagster's config check refuses ``{env: ...}`` before
the run is created; :func:`literal_resource` is a resource with that schema, and
:func:`literal_fields` the config schema of an op or asset from its ``Config`` class.
"""

from __future__ import annotations

from typing import Any, cast

import dagster as dg

__all__ = ["literal_field", "literal_fields", "literal_resource"]

#: Each source type and the plain type that takes the same literals.
_PLAIN = {
    dg.IntSource.key: int,
    dg.StringSource.key: str,
    dg.BoolSource.key: bool,
}


def _literal_type(config_type: Any) -> Any:
    """``config_type`` with every source type replaced by its plain type (through shapes,
    optional values and lists)."""
    plain = _PLAIN.get(config_type.key)
    if plain is not None:
        return plain
    kind = config_type.kind.name
    if kind == "NONEABLE":
        return dg.Noneable(_literal_type(config_type.inner_type))
    if kind == "ARRAY":
        return dg.Array(_literal_type(config_type.inner_type))
    if kind == "STRICT_SHAPE":
        return dg.Shape({name: literal_field(field) for name, field in config_type.fields.items()})
    if kind == "PERMISSIVE_SHAPE":
        return dg.Permissive(
            {name: literal_field(field) for name, field in config_type.fields.items()}
        )
    if kind in ("SCALAR_UNION", "SELECTOR"):
        raise TypeError(f"{config_type.given_name or config_type.key}: no literal-only form")
    return config_type


def literal_field(field: dg.Field) -> dg.Field:
    """``field`` (a Dagster config field, e.g. ``MyConfig.to_config_schema().as_field()``)
    taking literals only: same shape, defaults, descriptions and optionality."""
    default = {"default_value": field.default_value} if field.default_provided else {}
    return dg.Field(
        _literal_type(field.config_type),
        is_required=field.is_required,
        description=field.description,
        **default,
    )


def literal_fields(config_class: type[dg.Config]) -> dict[str, dg.Field]:
    """The fields of ``config_class`` taking literals only: the ``config_schema`` of an asset
    whose body builds ``config_class(**context.op_execution_context.op_config)``."""
    shape = cast("dg.Shape", config_class.to_config_schema().as_field().config_type)
    return {name: literal_field(field) for name, field in shape.fields.items()}


def literal_resource(
    resource: dg.ConfigurableResource | dg.ConfigurableIOManagerFactory,
) -> dg.ResourceDefinition:
    """``resource``'s definition with a literal-only config schema (:func:`literal_field`):
    the same resource (assets typed with its class receive an instance of it), configured
    with the run config's values as they are."""
    definition = resource.get_resource_definition()
    return definition.configured(
        lambda config: config,
        config_schema=literal_field(definition.config_schema.as_field()),
    )
