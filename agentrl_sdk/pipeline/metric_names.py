"""Every metric name a training job logs (``TrainResult.history``, MLflow) and an evaluation
reports (``EvalResult.metrics``, ``eval/<name>`` in MLflow), with its meaning and unit.

A name may hold placeholders: ``<component>`` (a reward component's name, which may contain
``/``), ``<status>``, ``<k>`` (an integer) and the like. Metrics of a policy's trainer, engine,
critic and weight pushes are named as shown for the default policy; another policy's carry its
name after the first part (``train/<policy>/loss``, ``critic/<policy>/value_loss``).
``docs/reference/metrics.md`` is generated from this table; a test trains a short job and checks
that every name it logs is here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["METRICS", "MetricName", "describe_metric"]


@dataclass(frozen=True)
class MetricName:
    """One metric, or a family of them when ``name`` has ``<placeholders>``."""

    name: str
    unit: str
    description: str
    group: str
    per_policy: bool = False  # another policy's copy has ``<policy>/`` after the first part


_TABLE = """
## Rollouts (every step and every evaluation)
rollouts | count | Rollouts in the step's batch (rows x rollout.n, plus any taken out by dynamic
    sampling).
reward/mean | reward | Mean reward of the scored rollouts (unscored ones, reward dropped, left
    out).
reward/std | reward | Population standard deviation of those rewards.
reward/<component> | reward | Mean of one named reward component (emit_reward, a tool's reward
    `tool/<name>`, the over-long penalty `overlong`) over the rollouts that have it.
tokens/generated | tokens | Tokens the engines sampled for the batch (a tree's shared trunk
    counted once).
tokens/generated_per_s | tokens/s | tokens/generated over time/rollout_s.
llm_calls/mean | calls | LLM calls per rollout.
time/rollout_s | s | Wall time of the batch's rollouts (in fully_async, the time since the
    previous batch was taken).
policy_version/sampled_min | version | Oldest policy version that sampled a token of the batch.
policy_version/sampled_max | version | Newest policy version that sampled a token of the batch
    (equal to the minimum when on-policy).
status/<status> | count | Rollouts that ended with this status: ok, context_exceeded,
    graph_error, engine_error or timeout.
## Rollout counters (summed over the batch's rollouts)
rollout/llm_calls | calls | LLM calls recorded.
rollout/generated_tokens | tokens | Tokens sampled, as the recorders counted them.
rollout/tool_calls | count | Tool calls parsed from generated text.
rollout/malformed_tool_calls | count | Tool calls that could not be parsed
    (rollout.chat.tool_parser).
rollout/forced_tool_calls | count | Calls whose tool call was forced by tool_choice (its opening
    tokens written, not sampled).
rollout/tool_errors | count | Tool calls that raised (the error went back to the model as the
    tool's output).
rollout/tool_timeouts | count | Tool calls that exceeded their time limit.
rollout/observations_truncated | count | Tool outputs cut to
    rollout.chat.max_observation_tokens.
rollout/context_exceeded | count | Calls refused because the prompt left no room in
    rollout.chat.max_context_tokens.
rollout/engine_retries | count | LLM calls retried after an engine replica failed.
rollout/engine_timeouts | count | LLM calls that got no answer within
    rollout.chat.request_timeout_s.
rollout/tools_created | count | Per-rollout tool instances created (RLTool).
rollout/tools_released | count | Per-rollout tool instances released.
rollout/tool_release_errors | count | Tool releases that raised.
rollout/tool_reward_errors | count | Tool reward functions that raised.
rollout/tree_branch_declined | count | Branch points a tree path passed unbranched because its
    call's entropy was below rollout.tree.min_entropy.
rollout/tree_fork_failed | count | Tree continuations that could not be forked from the saved
    graph state.
rollout/reward_error | count | Rollouts whose reward function raised or returned None/NaN.
rollout/textarena/illegal_moves | count | textarena: moves the game judged invalid (its own rule
    applied: a retry or the end of the game).
rollout/textarena/games_ended | count | textarena: games played to their end.
rollout/textarena/truncated | count | textarena: games cut off at max_turns (scored 0).
rollout/textarena/game_errors | count | textarena: games whose own code raised (scored 0).
rollout/segments_started.<reason> | count | Training segments started, by reason (first_call,
    new_conversation, history_edited, template_not_prefix_preserving, node_changed): a segment
    ends where the next prompt does not extend the previous tokens.
## Reward outcomes
count/reward_errors | count | Reward functions that raised or returned None/NaN (scored per
    reward.on_error).
count/rollouts_failed | count | Rollouts with a status other than ok (scored
    reward.failed_rollout_reward).
count/overlong_penalised_calls | count | LLM calls given the soft over-long penalty
    (algorithm.overlong.buffer).
count/rows_sampled | count | Rows rolled out for the update under dynamic sampling, with or
    without signal.
## Samples and advantages
samples | count | Training samples built from the batch (one per trained segment, or per LLM
    call with step-level credit).
rollouts_skipped | count | Rollouts left out because they were not scored.
rollouts_dropped_truncated | count | Rollouts left out by algorithm.overlong.drop_truncated.
groups_dropped_no_signal | count | (row, policy) groups left out by dynamic sampling because
    their rewards all agree.
adv_mean | advantage | Mean advantage over the rollouts.
adv_std | advantage | Population standard deviation of the advantages.
adv_groups | count | (row, policy) groups the advantages were baselined in.
adv_zero_std_group_frac | fraction | Share of groups whose rewards all agree (no signal: their
    advantages are 0).
step_adv_mean | advantage | Step-level credit: mean advantage per LLM call.
step_adv_std | advantage | Step-level credit: their population standard deviation.
step_return_mean | reward | Step-level credit: mean discounted return per call.
step_groups | count | GiGPO: anchor-state groups of calls.
step_group_size_mean | calls | GiGPO: calls per anchor-state group.
tree_intra_adv_std | advantage | Tree estimator: standard deviation of the within-tree part of
    the advantages.
## Policy update (per trained policy) | per policy
train/loss | loss | The policy loss (clipped surrogate, plus the KL term, minus the entropy
    bonus), averaged over optimizer steps.
train/pg_loss | loss | The clipped surrogate alone.
train/kl | nats | KL to the reference model (algorithm.kl_coef > 0).
train/clip_frac | fraction | Trained tokens where the clipped term won.
train/dual_clip_frac | fraction | Tokens capped by dual clip (algorithm.clip_c).
train/approx_kl | nats | k3 estimate of KL(old policy || new policy) per token.
train/ratio_mean | ratio | Mean probability ratio new / old over trained tokens.
train/entropy | nats/token | Mean entropy of the policy over trained tokens.
train/grad_norm | norm | Global gradient norm before clipping.
train/lr | learning rate | Learning rate of the update's last optimizer step.
train/tokens | tokens | Tokens in the batch, prompts included.
train/trained_tokens | tokens | Tokens with mask 1 (sampled by the policy).
train/samples | count | Samples in the batch.
train/samples_skipped | count | Samples left out of the forward and backward passes because none
    of their tokens has an advantage (the loss is unchanged).
train/optimizer_steps | count | Optimizer steps taken (ppo_epochs x num_mini_batches; 0 when
    skipped).
train/step | count | Optimizer steps taken since the start of training.
train/time_s | s | Time of the update in the trainer.
train/peak_rss_gb | GiB | Largest peak resident memory of any trainer rank so far.
train/restarts | count | Times the trainer group was rebuilt after a rank died.
train/skipped_no_signal | 0/1 | 1 when no token of the batch had an advantage and no optimizer
    step was taken.
train/is_weight_mean | ratio | Off-policy correction: mean importance weight pi_prox / pi_behav
    over trained tokens.
train/is_weight_min | ratio | Off-policy correction: smallest importance weight.
train/is_weight_max | ratio | Off-policy correction: largest importance weight.
train/is_capped_frac | fraction | Off-policy correction: tokens truncated (tis) or left out
    (decoupled) at algorithm.is_cap.
train/mismatch_kl | nats | k3 estimate of KL(engine || trainer) over the sampled tokens.
train/mismatch_abs_logp | nats | Mean |trainer logprob - engine logprob| per sampled token.
## Critic (advantage_estimator: gae) | per policy
critic/value_loss | loss | The clipped value loss.
critic/clip_fraction | fraction | Tokens where value clipping applied.
critic/grad_norm | norm | The critic's gradient norm before clipping.
critic/lr | learning rate | The critic's learning rate.
critic/time_s | s | Time of the critic update.
critic/restarts | count | Times the critic's group was rebuilt after a rank died.
critic/values_mean | value | Mean value over sampled tokens, before the update.
critic/returns_mean | reward | Mean GAE return over sampled tokens.
critic/advantages_mean | advantage | Mean GAE advantage before whitening.
critic/explained_variance | fraction | 1 - Var(returns - values) / Var(returns) (left out when
    the returns do not vary).
## Critic (advantage_estimator: gae)
critic/warmup | 0/1 | 1 while critic.warmup_updates train the critic alone.
## Weights and engines | per policy
policy_version | version | Version pushed to the engines (the updates they have).
weight_sync/bytes | bytes | Bytes one push moved (an adapter's alone with trainer.lora.sync:
    adapter).
engine/reroutes | count | Requests moved off a failed replica (engine pools).
engine/drained_replicas | count | Replicas taken out of service.
engine/failed_health_checks | count | Health checks that failed or timed out.
engine/restarts | count | Replicas rebuilt.
engine/failed_restarts | count | Replica rebuilds that failed.
## Time
time/train_s | s | Wall time of the step's policy (and critic) updates.
time/weight_sync_s | s | Wall time of the weight push (0 when none was due).
time/traces_build_s | s | Time spent building the step's MLflow traces.
## Pipeline
async/wait_s | s | Time the trainer waited for the batch's groups.
async/queued_groups | count | Finished groups waiting in the queue.
async/in_flight_groups | count | Groups still rolling out.
async/dropped_stale | count | Groups dropped so far as too stale (fully_async.on_stale: drop).
async/retried_stale | count | Rows rolled out again so far as too stale (fully_async.on_stale:
    retry).
async/dropped_no_signal | count | Groups without signal set aside so far by dynamic sampling.
async/engine_retries | count | Rows rolled out again so far after an engine failure.
async/repushes | count | Weight pushes repeated so far for a rebuilt engine.
async/partial_rollouts | count | Groups of the batch whose tokens span several policy versions.
staleness/<k> | count | Groups of the batch trained k updates after the weights that started
    them.
staleness/mean | updates | Mean staleness of the batch's groups.
staleness/max | updates | Largest staleness in the batch.
dynamic_sampling/rows_with_signal | count | Rows of the update whose groups have signal.
dynamic_sampling/extra_rounds | batches | Extra batches' worth of rows it took to fill the
    batch.
## Tracking
traces/logged | count | Rollout traces queued for MLflow this step.
traces/write_errors | count | Trace writes that failed so far.
traces/lost | count | Traces given up so far.
tracking/failed_writes | count | MLflow write attempts that failed so far (they are retried).
tracking/dropped_writes | count | MLflow writes given up so far.
tracking/pending_writes | count | MLflow writes still buffered.
data/skipped_rows | count | Dataset rows left out by validation (logged once, at step 0, to
    MLflow only).
## Evaluation (EvalResult.metrics; eval/<name> in MLflow)
pass_at_<k> | fraction | Unbiased pass@k averaged over rows, for k = 1, 2, 4, ... up to
    evaluation.n (and n itself); a sample passes when its reward is at least
    evaluation.pass_threshold.
rows | count | Held-out rows evaluated.
"""
"""The registry as the reference page shows it: ``## group`` headings (``| per policy``: names
a policy's trainer, critic or engine logs), then ``name | unit | description`` lines, an indented
line going on with the one above. Evaluations also report every ``Rollouts`` and ``Rollout
counters`` name."""


def _parse(table: str) -> list[MetricName]:
    metrics, group, per_policy = [], "", False
    for line in re.sub(r"\n +", " ", table.strip()).splitlines():
        if line.startswith("## "):
            group, _, marker = line[3:].partition(" | ")
            per_policy = marker == "per policy"
        else:
            name, unit, description = line.split(" | ", 2)
            metrics.append(MetricName(name, unit, description, group, per_policy))
    return metrics


METRICS: list[MetricName] = _parse(_TABLE)


def _regex(entry: MetricName) -> re.Pattern[str]:
    parts = re.split(r"(<[a-z_]+>)", entry.name)
    body = "".join(r"\d+" if p == "<k>" else ".+" if p.startswith("<") else re.escape(p)
                   for p in parts)  # fmt: skip
    if entry.per_policy:  # ``train/loss`` -> ``train/(<policy>/)?loss``
        head, sep, rest = body.partition("/")
        body = f"{head}(?:/[^/]+)?{sep}{rest}" if sep else f"{head}(?:/[^/]+)?"
    return re.compile(body)


_EXACT = {m.name: m for m in METRICS if "<" not in m.name}
_PATTERNS = [(m, _regex(m)) for m in METRICS]


def describe_metric(name: str) -> MetricName | None:
    """The registry entry of a logged metric name, or None when it has none."""
    if name in _EXACT:
        return _EXACT[name]
    for entry, regex in _PATTERNS:
        if regex.fullmatch(name):
            return entry
    return None
