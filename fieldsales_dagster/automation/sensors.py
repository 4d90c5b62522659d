"""The instance's sensors: token renewal (orchestration only) and core-table automation."""

from collections.abc import Callable

import dagster as dg

from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.token.renewal import RenewalPolicy, renew_or_check


def build_token_renewal_sensor(
    names: InstanceNames,
    policy: RenewalPolicy,
    on_failure: Callable[[Exception], None] | None = None,
) -> dg.SensorDefinition:
    """Each tick renews the token if due (``token/renewal.py`` holds the policy and the calls);
    ``on_failure`` (the alert, ``automation/alerts.py``) hears of a tick that fails."""
    renew_days = policy.renew_after.total_seconds() / 86400

    @dg.sensor(
        name=names.token_renewal_sensor,
        minimum_interval_seconds=int(policy.tick_interval.total_seconds()),
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={names.api.key},
        description=(
            "Renews the Field-Sales API token (valid 2 months) once it is older than "
            f"{renew_days:g} days (token_renew_after_days, FIELDSALES_TOKEN_RENEW_AFTER_DAYS): "
            "stores the new token durably in the token store, then tests it. Tests the current "
            "token once a day otherwise. A refused token fails the tick: regenerate it in your "
            "Field-Sales user profile (API tab) and set FIELDSALES_API_TOKEN. Requests no runs."
        ),
    )
    def _token_renewal(
        context: dg.SensorEvaluationContext, **resources: object
    ) -> dg.SensorResult | dg.SkipReason:
        # Invoked directly (tests), Dagster hands the required resources over as keywords.
        api = names.api.of(context)
        store = api.token_store()
        if store is None:
            return dg.SkipReason(
                "token renewal is off: use_token_store is False, so a renewed token could not be "
                "kept; FIELDSALES_API_TOKEN is used as it is."
            )
        try:
            outcome = renew_or_check(api, store, policy, context.cursor)
        except Exception as exc:
            if on_failure is not None:
                on_failure(exc)
            raise
        if outcome.renewed:
            context.log.info(f"Field-Sales API {outcome.message}; stored in {store.path}.")
        return dg.SensorResult(skip_reason=outcome.message, cursor=outcome.cursor)

    return _token_renewal


def build_core_automation_sensor(
    names: InstanceNames, target: dg.AssetSelection
) -> dg.AutomationConditionSensorDefinition:
    """Evaluates the automation conditions of ``target``: the core assets'
    ``AutomationCondition.eager()`` (after any raw table is refreshed, by the schedule, the UI or
    the CLI, the core tables that read it are rebuilt), and those of user assets downstream of
    them (README, "Build on it"). On by default, like the schedule; Dagster's own default
    automation sensor starts stopped."""
    return dg.AutomationConditionSensorDefinition(
        names.automation_sensor,
        target=target,
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=60,
        description=(
            "Rebuilds core tables once their raw parents were refreshed "
            "(AutomationCondition.eager), and any asset downstream of them that has an "
            "automation condition (your own assets on the core and mart tables)."
        ),
    )
