"""Stage ppo: proximal policy optimisation against a trained reward model, on accelerate.

TRL 1.x no longer ships a PPO trainer, so this module holds a compact one. Each PPO step:

1. takes the next `per_device_train_batch_size x gradient_accumulation_steps x ppo_buffer_size`
   prompts of an epoch's seeded order (each process its own share), already rendered with the
   stage's template up to the assistant's turn;
2. samples a reply to each with the policy (the stage's `top_p`, `top_k`, `temperature`,
   `max_new_tokens`; always sampling, as PPO explores), ending at the template's stop tokens;
3. scores prompt and reply with the reward model (`reward_model`: a stage rm output), reads the
   policy's and the reference's log-probabilities and the value head's values on every reply token,
   and turns them into per-token rewards (KL penalty, score at the end), advantages and returns;
4. runs `ppo_epochs` passes over the rollouts in shuffled mini-batches of
   `per_device_train_batch_size`, one optimizer step per `gradient_accumulation_steps` of them,
   on the clipped policy loss plus 0.1 x the clipped value loss;
5. steps the learning-rate schedule once, and moves the KL coefficient towards `ppo_target`.

The policy is the stage's model with its method applied (LoRA, freeze, full) and a linear value
head on its last hidden state (LLaMA-Factory's shape: one backbone for both). The reference is the
policy with its adapter switched off for LoRA (no second model), a frozen copy of the starting
model otherwise, or `ref_model`. Dropout is off in the policy so that log-probabilities of the same
tokens agree between rollout and update.

Checkpoints (`save_steps`) hold the trainable weights (adapter or model), the value head, the
optimizer, the schedule, every process's random state, the KL coefficient and the score
statistics, so a resumed run continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tuneline.core.config import FinetuningConfig, GeneratingConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.stages.kind import LoopRequest, ModelRequest
from tuneline.core.stages.ppo.arithmetic import (
    AdaptiveKLController,
    RunningMoments,
    advantages_and_returns,
    clipped_losses,
    masked_whiten,
    token_rewards,
)

if TYPE_CHECKING:
    from accelerate import Accelerator
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainingArguments

# Fixed as in LLaMA-Factory's PPO (TRL's former defaults); LLaMA-Factory exposes none of them.
INIT_KL_COEF = 0.2
KL_HORIZON = 10_000
GAMMA = 1.0
LAM = 0.95
CLIPRANGE = 0.2
CLIPRANGE_VALUE = 0.2
VF_COEF = 0.1


class ValueHeadModel(torch.nn.Module):
    """The policy plus a linear value head reading its last hidden state."""

    def __init__(self, policy: PreTrainedModel) -> None:
        super().__init__()
        self.policy = policy
        hidden = policy.config.get_text_config().hidden_size
        self.value_head = torch.nn.Linear(hidden, 1, device=policy.device, dtype=torch.float32)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        output = self.policy(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
        values = self.value_head(output.hidden_states[-1].float()).squeeze(-1)
        return output.logits, values


@dataclass
class Rollouts:
    """One PPO step's experience; per-position tensors are in the shifted (next-token) frame."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor  # 1 where the position predicts a reply token
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    scores: torch.Tensor  # reward-model scores, before normalisation
    kl: torch.Tensor  # per position, policy minus reference log-probability


def sequence_batch(prompts: list[list[int]], replies: list[list[int]], *, pad_token_id: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + reply rows padded on the right: ids, attention mask, and the mask of the positions
    (shifted frame, width - 1) that predict a reply token."""
    width = max(len(p) + len(r) for p, r in zip(prompts, replies))
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width - 1), dtype=torch.float32)
    for row, (prompt, reply) in enumerate(zip(prompts, replies)):
        length = len(prompt) + len(reply)
        ids[row, :length] = torch.tensor(prompt + reply)
        attention[row, :length] = 1
        mask[row, len(prompt) - 1 : length - 1] = 1
    return ids.to(device), attention.to(device), mask.to(device)


def cut_reply(generated: list[int], *, stops: set[int], pad_token_id: int) -> list[int]:
    """The reply up to and including its first stop token; without one, all but trailing padding."""
    for index, token in enumerate(generated):
        if token in stops:
            return generated[: index + 1]
    while len(generated) > 1 and generated[-1] == pad_token_id:
        generated = generated[:-1]
    return generated


class PPOTrainer:
    """Runs stage ppo for one process; see the module docstring for the algorithm."""

    def __init__(self, *, model: ValueHeadModel, reference: PreTrainedModel | None, reward_model: PreTrainedModel,
                 tokenizer: PreTrainedTokenizerBase, train_dataset: Dataset, args: TrainingArguments,
                 finetuning: FinetuningConfig, generating: GeneratingConfig, accelerator: Accelerator) -> None:
        from transformers import get_scheduler

        from tuneline.core.evaluation.predict import generation_kwargs

        self.args, self.finetuning, self.accelerator = args, finetuning, accelerator
        self.tokenizer, self.train_dataset = tokenizer, train_dataset
        self.reference, self.reward_model = reference, reward_model
        self.rollout_size = args.per_device_train_batch_size * args.gradient_accumulation_steps * finetuning.ppo_buffer_size
        self.steps_per_epoch = max(1, math.ceil(len(train_dataset) / (self.rollout_size * accelerator.num_processes)))
        self.total_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * self.steps_per_epoch)
        sampling = dataclasses.replace(generating, do_sample=True)
        self.generate_kwargs = generation_kwargs(sampling, tokenizer, model.policy)
        self.stops = set(self.generate_kwargs["eos_token_id"])
        self.kl = AdaptiveKLController(INIT_KL_COEF, target=finetuning.ppo_target, horizon=KL_HORIZON)
        self.score_moments = RunningMoments()
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                                      eps=args.adam_epsilon, weight_decay=args.weight_decay)
        self.scheduler = get_scheduler(args.lr_scheduler_type, optimizer,
                                       num_warmup_steps=args.get_warmup_steps(self.total_steps),
                                       num_training_steps=self.total_steps)
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        self.step = 0

    @property
    def unwrapped(self) -> ValueHeadModel:
        return self.accelerator.unwrap_model(self.model)

    # -- data ----------------------------------------------------------------------------------

    def prompts_for(self, step: int) -> list[list[int]]:
        """This process's prompts for PPO step `step`: a slice of the epoch's seeded order."""
        epoch, index = divmod(step, self.steps_per_epoch)
        order = torch.randperm(len(self.train_dataset), generator=torch.Generator().manual_seed(self.args.seed + epoch))
        size, processes = self.rollout_size, self.accelerator.num_processes
        start = (index * processes + self.accelerator.process_index) * size
        picked = [order[(start + i) % len(order)].item() for i in range(size)]  # the last batch wraps round
        return [list(ids) for ids in self.train_dataset[picked]["input_ids"]]

    # -- rollouts ------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, reference: bool = False, **overrides: Any) -> list[list[int]]:
        """A reply to each prompt from the policy (or the reference), prompts left-padded."""
        kwargs = {**self.generate_kwargs, **overrides}
        pad = kwargs["pad_token_id"]
        width = max(len(p) for p in prompts)
        device = self.accelerator.device
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        policy = self.unwrapped.policy
        with self._reference_context(reference) as generator:
            generator = generator or policy
            generator.eval()
            output = generator.generate(input_ids=ids, attention_mask=attention, **kwargs)
        return [cut_reply(row[width:].tolist(), stops=self.stops, pad_token_id=pad) for row in output]

    def _reference_context(self, reference: bool):
        """Context giving the model to run as the reference: the frozen model, or None with the
        policy's adapter switched off."""
        if not reference:
            return contextlib.nullcontext(None)
        if self.reference is not None:
            return contextlib.nullcontext(self.reference)
        return _adapter_off(self.unwrapped.policy)

    @torch.no_grad()
    def log_probabilities(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                          reference: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probabilities of each next token (and the values, for the policy), in mini-batches."""
        size = self.args.per_device_train_batch_size
        logprobs, values = [], []
        for start in range(0, len(input_ids), size):
            ids, attention = input_ids[start : start + size], attention_mask[start : start + size]
            if reference:
                with self._reference_context(True) as frozen:
                    model = frozen or self.unwrapped.policy
                    with self.accelerator.autocast():
                        logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits
            else:  # the unwrapped model: a no-grad pass needs no gradient sync, and evaluation runs on rank 0 alone
                with self.accelerator.autocast():
                    logits, value = self.unwrapped(input_ids=ids, attention_mask=attention)
                values.append(value[:, :-1].float())
            logprobs.append(_next_token_logprobs(logits, ids))
        return torch.cat(logprobs), torch.cat(values) if values else None

    def scores(self, prompts: list[list[int]], replies: list[list[int]]) -> torch.Tensor:
        from tuneline.core.evaluation.reward import score

        texts = [prompt + reply for prompt, reply in zip(prompts, replies)]
        return score(self.reward_model, self.tokenizer, texts, batch_size=self.args.per_device_train_batch_size).to(
            self.accelerator.device)

    def rollouts(self, prompts: list[list[int]]) -> Rollouts:
        replies = self.generate(prompts)
        ids, attention, mask = sequence_batch(prompts, replies, pad_token_id=self.tokenizer.pad_token_id,
                                              device=self.accelerator.device)
        self.model.eval()
        logprobs, values = self.log_probabilities(ids, attention)
        ref_logprobs, _ = self.log_probabilities(ids, attention, reference=True)
        raw_scores = self.scores(prompts, replies)
        scores = raw_scores
        if self.finetuning.ppo_score_norm:
            self.score_moments.update(self.accelerator.gather(raw_scores))
            scores = (raw_scores - self.score_moments.mean) / max(self.score_moments.std, 1e-8)
        rewards, kl = token_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=self.kl.value)
        if self.finetuning.ppo_whiten_rewards:
            rewards = masked_whiten(rewards, mask, shift_mean=False)
        advantages, returns = advantages_and_returns(values, rewards, mask, gamma=GAMMA, lam=LAM)
        return Rollouts(ids, attention, mask, logprobs, values, advantages, returns, raw_scores, kl)

    # -- optimisation --------------------------------------------------------------------------

    def optimize(self, batch: Rollouts) -> dict[str, float]:
        """`ppo_epochs` passes of clipped-loss updates over the rollouts; the mean statistics."""
        args, accelerator = self.args, self.accelerator
        size, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
        self.model.train()
        totals: dict[str, float] = {}
        updates = 0
        for _ in range(self.finetuning.ppo_epochs):
            order = torch.randperm(len(batch.input_ids)).tolist()
            for first in range(0, len(order), size * accumulation):
                group = order[first : first + size * accumulation]
                chunks = [group[i : i + size] for i in range(0, len(group), size)]
                for number, rows in enumerate(chunks):
                    last = number == len(chunks) - 1
                    with accelerator.no_sync(self.model) if not last else contextlib.nullcontext():
                        losses = self._losses(batch, rows)
                        accelerator.backward(losses.total / len(chunks))
                    for name, value in (("loss", losses.total), ("policy_loss", losses.policy),
                                        ("value_loss", losses.value), ("clipfrac", losses.policy_clipped),
                                        ("approx_kl", losses.approx_kl)):
                        totals[name] = totals.get(name, 0.0) + value.item()
                    updates += 1
                if args.max_grad_norm and args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad()
        return {name: value / max(updates, 1) for name, value in totals.items()}

    def _losses(self, batch: Rollouts, rows: list[int]):
        with self.accelerator.autocast():
            logits, values = self.model(input_ids=batch.input_ids[rows], attention_mask=batch.attention_mask[rows])
        logprobs = _next_token_logprobs(logits, batch.input_ids[rows])
        return clipped_losses(logprobs, batch.logprobs[rows], values[:, :-1].float(), batch.values[rows],
                              batch.advantages[rows], batch.returns[rows], batch.mask[rows],
                              cliprange=CLIPRANGE, cliprange_value=CLIPRANGE_VALUE, vf_coef=VF_COEF)

    def train_step(self) -> dict[str, float]:
        """One PPO step: rollouts, updates, schedule and KL coefficient; its statistics (all processes)."""
        batch = self.rollouts(self.prompts_for(self.step))
        stats = self.optimize(batch)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        sequence_kl = self.accelerator.gather(batch.kl.sum(dim=1)).mean().item()
        stats.update(
            reward=self.accelerator.gather(batch.scores).mean().item(),
            kl=sequence_kl,
            kl_coef=self.kl.value,
            response_length=self.accelerator.gather(batch.mask.sum(dim=1)).mean().item(),
            lr=lr,
        )
        stats = {k: self.accelerator.reduce(torch.tensor(v, device=self.accelerator.device), "mean").item()
                 if k in ("loss", "policy_loss", "value_loss", "clipfrac", "approx_kl") else v for k, v in stats.items()}
        self.kl.update(sequence_kl, samples=self.rollout_size * self.accelerator.num_processes)
        self.step += 1
        return stats

    # -- evaluation ----------------------------------------------------------------------------

    def evaluate(self, prompts: list[list[int]], *, max_new_tokens: int) -> dict[str, float]:
        """Greedy replies to held-out prompts from the reference (the starting policy unless
        `ref_model` names another) and from the trained policy: their mean reward-model score, their
        length, and, for the policy's replies, their mean KL from the reference (log-probability
        ratio summed over the reply; the reference's own replies have none by definition)."""
        results: dict[str, float] = {}
        greedy = {"do_sample": False, "top_p": None, "top_k": None, "temperature": None, "max_new_tokens": max_new_tokens}
        size = self.args.per_device_eval_batch_size
        for suffix, reference in (("_before", True), ("", False)):
            scores, kls, lengths = [], [], []
            for start in range(0, len(prompts), size):
                chunk = prompts[start : start + size]
                replies = self.generate(chunk, reference=reference, **greedy)
                ids, attention, mask = sequence_batch(chunk, replies, pad_token_id=self.tokenizer.pad_token_id,
                                                      device=self.accelerator.device)
                if not reference:
                    self.model.eval()
                    logprobs, _ = self.log_probabilities(ids, attention)
                    ref_logprobs, _ = self.log_probabilities(ids, attention, reference=True)
                    kls.append(((logprobs - ref_logprobs) * mask).sum(dim=1))
                scores.append(self.scores(chunk, replies))
                lengths.append(mask.sum(dim=1))
            results[f"eval_ppo_reward{suffix}"] = torch.cat(scores).mean().item()
            if kls:
                results["eval_ppo_kl"] = torch.cat(kls).mean().item()
            results[f"eval_ppo_response_length{suffix}"] = torch.cat(lengths).mean().item()
        results["eval_ppo_reward_gain"] = results["eval_ppo_reward"] - results["eval_ppo_reward_before"]
        results["eval_ppo_prompts"] = float(len(prompts))
        return results


def _next_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    from trl.trainer.utils import selective_log_softmax

    return selective_log_softmax(logits[:, :-1].float(), input_ids[:, 1:])


def _adapter_off(policy):
    """The policy's LoRA adapter switched off for the duration (yields None: run the policy itself)."""

    @contextlib.contextmanager
    def switched_off():
        with policy.disable_adapter():
            yield None

    return switched_off()


def train_ppo(request: LoopRequest) -> dict[str, float]:
    """Stage ppo end to end in this process: build, resume, train, save, evaluate; the metrics."""
    from accelerate import Accelerator
    from trl.trainer.utils import disable_dropout_in_model

    from tuneline.core.models.loading import load_reward_model, trainable_summary
    from tuneline.core.stages.causal_lm import load_policy
    from tuneline.core.stages.ppo.checkpoint import PPOLog, load_checkpoint, save_checkpoint, save_outputs
    from tuneline.core.stages.preference import reference_model
    from tuneline.core.training.method_record import method_record, qualified_name, report

    job, args, tokenizer, datasets = request.job, request.args, request.tokenizer, request.datasets
    checkpoint, finetuning, model_config = request.checkpoint, request.finetuning, request.model_config
    accelerator = Accelerator(cpu=args.use_cpu, mixed_precision="bf16" if args.bf16 else "fp16" if args.fp16 else "no")
    policy = load_policy(ModelRequest(model_path=job.model_path, tokenizer=tokenizer, finetuning=finetuning,
                                      model_config=model_config, training=job.training,
                                      model_max_length=job.model_max_length, new_tokens=request.new_tokens))
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs or
                                             {"use_reentrant": False})
    disable_dropout_in_model(policy)
    model = ValueHeadModel(policy)
    print(trainable_summary(model), flush=True)
    reference = reference_model(policy, finetuning, model_config=model_config, vocab_size=len(tokenizer),
                                training=job.training, model_max_length=job.model_max_length)
    # the policy's hub token, cache and trust settings; its revision names a commit of the policy only
    reward_model, reward_tokenizer = load_reward_model(finetuning.reward_model, model=ModelConfig(
        trust_remote_code=model_config.trust_remote_code, hf_hub_token=model_config.hf_hub_token,
        cache_dir=model_config.cache_dir, allow_pickle_weights=model_config.allow_pickle_weights,
        quantization_bit=finetuning.reward_model_quantization_bit))
    _check_same_vocabulary(tokenizer, reward_tokenizer, reward_path=finetuning.reward_model)
    for frozen in (reference, reward_model):
        if frozen is not None and getattr(frozen, "hf_quantizer", None) is None:  # quantized ones load in place
            frozen.to(accelerator.device)
    if checkpoint:
        load_checkpoint(Path(checkpoint), model=model, optimizer=None, trainer=None)
    trainer = PPOTrainer(model=model, reference=reference, reward_model=reward_model, tokenizer=tokenizer,
                         train_dataset=datasets["train"], args=args, finetuning=finetuning,
                         generating=GeneratingConfig(**job.generating), accelerator=accelerator)
    if checkpoint:
        load_checkpoint(Path(checkpoint), model=None, optimizer=trainer.optimizer, trainer=trainer)
    if accelerator.is_main_process:
        report(method_record(policy, trainer.optimizer, loss=f"{qualified_name(PPOTrainer)}._losses"),
               tracking_uri=job.tracking_uri, run_id=job.run_id)
    log = PPOLog(job.output_dir, total_steps=trainer.total_steps, start_step=trainer.step, steps_per_epoch=trainer.steps_per_epoch,
                 tracking_uri=job.tracking_uri, run_id=job.run_id, main=accelerator.is_main_process)
    started = time.monotonic()
    while trainer.step < trainer.total_steps:
        stats = trainer.train_step()
        if trainer.step % max(int(args.logging_steps), 1) == 0 or trainer.step == trainer.total_steps:
            log.write(trainer.step, stats)
        if args.save_strategy == "steps" and args.save_steps and trainer.step % int(args.save_steps) == 0:
            save_checkpoint(Path(job.output_dir), trainer, limit=job.training.get("save_total_limit"))
    metrics = {"train_runtime": round(time.monotonic() - started, 4), "train_steps": float(trainer.total_steps),
               **{f"train_{k}": v for k, v in log.last.items()}}
    if "validation" in datasets and accelerator.is_main_process:
        prompts = [list(ids) for ids in datasets["validation"]["input_ids"]]
        metrics.update(trainer.evaluate(prompts, max_new_tokens=GeneratingConfig(**job.generating).max_new_tokens))
    accelerator.wait_for_everyone()
    save_outputs(Path(job.output_dir), trainer, tokenizer=tokenizer, metrics=metrics)
    return metrics


def _check_same_vocabulary(policy: PreTrainedTokenizerBase, reward: PreTrainedTokenizerBase, *, reward_path: str) -> None:
    """Replies are scored as the policy's token ids, so both must read ids alike."""
    if policy.get_vocab() != reward.get_vocab():
        raise ConfigError(f"'reward_model: {reward_path}' uses another tokenizer than the policy; train the reward model "
                          "from the same base (or its fine-tuned descendant) so it reads the policy's tokens.")
