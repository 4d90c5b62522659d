"""The instance's sensors: token renewal (the sensor decides, its job renews) and automation."""

import dagster as dg

from fieldsales_dagster.automation.renewal import (
    RENEWAL_OFF,
    TICK_INTERVAL,
    RenewalPolicy,
    decide,
    renew_or_check,
)
from fieldsales_dagster.names import InstanceNames


def build_token_renewal_job(names: InstanceNames, policy: RenewalPolicy) -> dg.JobDefinition:

    @dg.op(
        name=names.token_renewal_op,
        required_resource_keys={names.api.key},
        description="Renews the Field-Sales API token if due (else tests it); see the sensor.",
    )
    def _renew_token(context: dg.OpExecutionContext) -> str:
        api = names.api.of(context)
        if (store := api.token_store()) is None:
            raise dg.Failure(RENEWAL_OFF)
        message = renew_or_check(api, store, policy)
        context.log.info(f"Field-Sales API {message}.")
        return message

    @dg.job(name=names.token_renewal_job, description=_renew_token.description)
    def _job() -> None:
        _renew_token()

    return _job


def build_token_renewal_sensor(names: InstanceNames, policy: RenewalPolicy) -> dg.SensorDefinition:
    renew_days = policy.renew_after.total_seconds() / 86400

    @dg.sensor(
        name=names.token_renewal_sensor,
        # By name (the job is the instance's, bound to its resources there): a sensor that holds
        # a job Dagster rebinds is rebuilt with a beta parameter, and warns on every load.
        job_name=names.token_renewal_job,
        minimum_interval_seconds=int(TICK_INTERVAL.total_seconds()),
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={names.api.key},
        description=(
            "Requests a run of the renewal job once the Field-Sales API token is older than "
            f"{renew_days:g} days (FIELDSALES_TOKEN_RENEW_AFTER_DAYS), and once a day to test it. "
            "The sensor only reads the token store; the run renews it."
        ),
    )
    def _token_renewal(
        context: dg.SensorEvaluationContext, **resources: object
    ) -> dg.SensorResult | dg.SkipReason:
        # Invoked directly (tests), Dagster hands the required resources over as keywords.
        api = names.api.of(context)
        if (store := api.token_store()) is None:
            return dg.SkipReason(RENEWAL_OFF)
        run, message, cursor = decide(store, api.env_token(), policy, context.cursor)
        runs = [dg.RunRequest(run_key=cursor, tags={"fieldsales/token": message})] if run else []
        return dg.SensorResult(runs, skip_reason=None if run else message, cursor=cursor)

    return _token_renewal


def build_core_automation_sensor(
    names: InstanceNames, target: dg.AssetSelection
) -> dg.AutomationConditionSensorDefinition:
    """On by default, like the schedule; Dagster's own default automation sensor starts stopped."""
    return dg.AutomationConditionSensorDefinition(
        names.automation_sensor,
        target=target,
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=60,
        description=(
            "Rebuilds the core tables after their raw parents (AutomationCondition.eager), and "
            "any asset on them that has an automation condition (your own, README: Build on it)."
        ),
    )
