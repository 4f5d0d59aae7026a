"""`Engine`: the library entry point. `Engine(config, adapters).generate(requests)` yields `Result`s.

Requests are pulled lazily (a window of waiting sequences), scheduled with continuous batching and
adapter-aware admission, run by the `ModelRunner`, and returned as soon as each finishes (any order). A request
with n > 1 runs as n sequences (engine/fork.py) and is returned once, when its last sample finished.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.block_manager import BlockManager
from multilora_cli.engine.detokenizer import StopChecker
from multilora_cli.engine.device_adapters import lora_targets
from multilora_cli.engine.gc_heap import FrozenHeap
from multilora_cli.engine.generation_config import read_generation_config
from multilora_cli.engine.grammar.compiler import GrammarCompiler
from multilora_cli.engine.grammar.rows import GrammarRows, GrammarStop
from multilora_cli.engine.identities import AdapterIdentities, PendingIdentity, identity_threads
from multilora_cli.engine.logprobs import entries
from multilora_cli.engine.pinned import PinnedArena, arena_bytes, host_cache_capacity, reads_ahead_capacity
from multilora_cli.engine.request import EngineStats, Request, Result, Sample, TokenLogprob
from multilora_cli.engine.runner import ModelRunner
from multilora_cli.engine.scheduler import Scheduler
from multilora_cli.engine.scoring import score_of, scoring_ids
from multilora_cli.engine.sequence import Sequence
from multilora_cli.engine.slots import SlotManager
from multilora_cli.engine.startup import StartupClock
from multilora_cli.engine.tokenizer import Tokenizer
from multilora_cli.errors import (
    AdapterError,
    ConfigError,
    EngineError,
    MultiloraError,
    RequestError,
    UnsupportedAdapterError,
)
from multilora_cli.models.config import ModelConfig

# slot loads per step made ahead of admission while the step runs (Scheduler.preload): a plain load is ~0.2 ms
# of host time, well inside a decode step; a DoRA load a few ms. A load racing a step would be a silent wrong
# answer; the ordering that prevents it (load stream, events at install and eviction) is stated once in
# engine/slot_writer.py. tests/engine/test_engine_preload_gpu.py checks tokens against HF + PEFT with preloads
# on and off, with host-warm adapters (preloads certain to fire) and under slot pressure with run-ahead.
PRELOADS_PER_STEP = 2


def device_label(device: torch.device) -> str:
    """'cpu', or 'cuda:0 (NVIDIA H200)': the GPU's name, so run stats say what they measured on (economics)."""
    if device.type != "cuda":
        return str(device)
    return f"{device} ({torch.cuda.get_device_name(device)})"


class Engine:
    """Offline multi-LoRA generation over one base model.

    config:   EngineConfig (config.model is a local model directory).
    adapters: {name: local adapter directory}, already resolved and validated (adapters.preflight).
    scans:    {name: adapters.scan.AdapterScan} from that validation (`Preflight.scans`), optional: the engine
              plans each adapter's reads from them instead of scanning every adapter again (~3-9 ms each).
    tokenizer: config.model's Tokenizer when the caller loaded it already (the run: it counts the prompt tokens).
    """

    def __init__(
        self,
        config: EngineConfig,
        adapters: dict[str, Path] | None = None,
        model_config: ModelConfig | None = None,
        scans: dict | None = None,
        tokenizer: Tokenizer | None = None,
    ):
        self.startup = StartupClock()  # the stats' "startup" section (engine/startup.py)
        self._heap = FrozenHeap()  # the start's objects frozen for the collector while a run goes (gc_heap.py)
        self.config = config
        self.adapters = {name: Path(p) for name, p in (adapters or {}).items()}
        self._scans = {n: s for n, s in (scans or {}).items() if n in self.adapters and s.path == self.adapters[n]}
        self.model_config = model_config or ModelConfig.from_dir(config.model)
        limit = self.model_config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > limit:
            # positions past the trained range give garbage silently (and rope tables are sized to it)
            raise ConfigError(
                f"--max-model-len {config.max_model_len} is above the model's max_position_embeddings "
                f"({limit}, {Path(config.model) / 'config.json'})",
                hint=f"use --max-model-len {limit} or less, or shorten the prompts",
            )
        self.tokenizer = tokenizer if tokenizer is not None else Tokenizer.from_dir(config.model)
        gen = read_generation_config(config.model)
        self.default_sampling: dict = dict(gen.sampling)
        eos = [*self.model_config.eos_token_ids, *gen.eos_token_ids, *self.tokenizer.eos_token_ids]
        self.eos_token_ids = list(dict.fromkeys(eos))
        # adapter -> its prefix-cache identity (`_prefix_id`), hashed on workers (identities.py): all of them
        # queued now, so they are hashed while the model loads and compiles, not at the first admissions (issue
        # 38: 69 hashes of ~10 ms on the step loop at 1,000 adapters); the admissions' order goes first after
        self.identities = AdapterIdentities(self.adapters, threads=identity_threads(config.prefetch_threads))
        if config.prefix_cache:
            self.identities.start_all(self.adapters)
        self.runner = ModelRunner(
            config,
            self.model_config,
            use_lora=bool(self.adapters),
            lora_targets=lora_targets(self.adapters, self._scans, self.model_config),
            dora=(dora := self._uses_dora()),
            vocab=self._vocab_parts(),
            eos_token_ids=self.eos_token_ids,
        )
        self.runner.token_texts = self._texts  # (a step's logprob entries are made as its ids come back)
        self.max_model_len = self.runner.max_model_len
        t0 = time.perf_counter()
        self._read_plans: dict = {}  # name -> direct_read.ReadPlan, made with the arena's sizes
        self._base_checked: set = set()  # (adapter, file identity) whose saved base embed / head equal the base's
        self.arena, self.host_cache_loras, reads_ahead = self._make_arena()
        # CUDA: an adapter's NaN / Inf check runs on its slot load's device copy (engine/slot_writer.py), not on the
        # host beside the reads and the step loop; a broken adapter's sequences fail after the step that loaded it
        # (`_verify`). Not with DoRA rows: their norms are computed from A / B at the load
        self._device_checks = self.runner.device.type == "cuda" and self.runner.max_loras > 0 and not dora
        # the file pieces of one adapter read in parallel (direct_read.read_spans): CUDA reads straight into the arena
        self._readers = (
            ThreadPoolExecutor(config.read_threads, thread_name_prefix="lora-read")
            if self.runner.device.type == "cuda" and self.adapters and config.read_threads > 1
            else None
        )
        self.arena_seconds = time.perf_counter() - t0  # startup: planning the adapters' reads, page-locking the arena
        self.slots = SlotManager(
            config.max_loras,
            self.host_cache_loras,
            load_cpu=self._load_cpu,
            install=self.runner.install_adapter,
            evict=self.runner.evict_adapter,
            prefetch_threads=config.prefetch_threads if self.adapters else 0,
            stage=self.runner.stage_adapter,
            stage_ahead=self.runner.staging_buffers,
            read_ahead=reads_ahead,  # one wave of admissions (however large the pool), as the arena holds them
        )
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, window=self.model_config.kv_window)
        self.scheduler = Scheduler(
            config,
            self.block_manager,
            self.slots,
            max_model_len=self.max_model_len,
            private_prompts_upto=self.runner.model.long_rope_from,
        )
        self.stop = StopChecker(self.tokenizer, self.eos_token_ids, self.max_model_len)
        self.grammar: GrammarRows | None = None  # structured output, made at the first constrained request
        self.stats = EngineStats(
            model=str(config.model),
            device=device_label(self.runner.device),
            dtype=str(self.runner.dtype).removeprefix("torch."),
            max_loras=config.max_loras,
            max_lora_rank=config.max_lora_rank,
        )
        self._next_seq_id = 0
        self._token_texts: list[str] | None = None  # token id -> its text, for logprobs (_token_text)
        self._samples: dict[int, list[Sequence]] = {}  # request key -> its finished samples (n > 1), until all are
        self.schedule_seconds = 0.0  # host time in Scheduler.schedule + postprocess (slot installs included)
        # the rest of the step loop's host time, so a bench can split its time outside steps (issue 38)
        self.feed_seconds = 0.0  # pulling + tokenizing + queueing requests (`_admit`)
        self.results_seconds = 0.0  # finished sequences -> Results (`_finished`)
        self.preload_seconds = 0.0  # Scheduler.preload (also counted in schedule_seconds)
        # slot loads made ahead of admission while a step runs (CUDA: the loads overlap it; CPU loads are
        # synchronous, so there is nothing to gain there)
        self.preloads_per_step = PRELOADS_PER_STEP if self.runner.device.type == "cuda" and self.adapters else 0
        self.startup.ready()

    # --- adapters ---------------------------------------------------------------------------------------------
    def _load_cpu(self, name: str):
        """Read + validate an adapter into host memory, packed for one-copy slot loads (see `_pack`)."""
        from multilora_cli.adapters.peft import load_adapter
        from multilora_cli.engine.direct_read import read_packed

        # file -> arena block in a few calls (engine/direct_read.py), or a pageable buffer when the arena is full
        # or absent (CUDA); .bin files, mixed dtypes and vocab-only adapters (read_packed gives None) go through
        # load_adapter + pack, as do adapters on CPU (not packed)
        if self.runner.device.type == "cuda":
            packed = read_packed(
                self.adapters[name],
                name,
                self.model_config,
                self.runner.dtype,
                self.arena,
                planned=self._read_plans.get(name),
                pageable=True,
                readers=self._readers,
                check=not self._device_checks,
            )
            if packed is not None:
                return self._check_base_copies(self._check_rank(packed))
        adapter = load_adapter(self.adapters[name], name, self.model_config, dtype=self.runner.dtype)
        return self._pack(self._check_base_copies(self._check_rank(adapter)))

    def _check_base_copies(self, adapter):
        """An adapter with LoRA on embed_tokens / lm_head carries PEFT's copy of that base layer, which PEFT
        loads over the base's (adapters/vocab.py): served when it equals the base's weight (then dropped), refused
        when it differs (a trained or resized vocabulary: the copy would have to be a per-adapter weight)."""
        vocab = getattr(adapter, "vocab", None)
        if vocab is None or not vocab.base_copies:
            return adapter
        from multilora_cli.adapters.scan import file_ident

        checked = (adapter.name, file_ident(adapter.weights_path))  # read and compared once per adapter file
        if checked in self._base_checked:
            vocab.base_copies = {}
            return adapter
        model = self.runner.model
        for module, read in vocab.base_copies.items():
            base = model.model.embed_tokens.weight if module == "embed_tokens" else model.lm_head.weight
            if not torch.equal(read().to(base.device, base.dtype), base):
                raise UnsupportedAdapterError(
                    f"adapter {adapter.name!r} ({adapter.weights_path}) saves a {module} base layer that differs "
                    "from the base model's (trained or changed embeddings), which multilora cannot serve yet",
                    hint="merge the adapter with PEFT merge_and_unload, or save it with modules_to_save "
                    f"[{module!r}] instead of a LoRA on it",
                )
        vocab.base_copies = {}  # equal to the base's: nothing to keep (a copy is [V, H])
        self._base_checked.add(checked)
        return adapter

    def _check_rank(self, adapter):
        if adapter.max_rank > self.config.max_lora_rank:
            raise EngineError(
                f"adapter {adapter.name!r} has rank {adapter.max_rank} > max_lora_rank {self.config.max_lora_rank}",
                hint="raise --max-lora-rank",
            )
        return adapter

    def _pack(self, adapter):
        """On CUDA: ONE host buffer laid out like the slots (engine/packed.py), so a slot load is one copy plus
        one scatter. The buffer is a block of the page-locked arena registered at start (engine/pinned.py), so
        that copy is an async DMA; a fresh pinned buffer per adapter stalled the running steps (7,951 vs 10,068
        tok/s pageable). When the arena is full: pageable memory, whose ~13 ms synchronous copy the prefetch
        thread makes ahead for the next loads (engine/staging.py)."""
        if self.runner.device.type != "cuda" or not (adapter.modules or adapter.experts):
            return adapter  # (nothing: an embed_tokens / lm_head-only adapter, nothing to pack)
        from multilora_cli.engine.packed import pack_adapter

        return pack_adapter(adapter, pin=False, dtype=self.runner.dtype, arena=self.arena)

    def _uses_dora(self) -> bool:
        """Whether some adapter of the run says use_dora: then every LoRA module gets DoRA scale rows (an
        unreadable config is reported by that adapter's load, per request)."""
        from multilora_cli.adapters.config import AdapterConfig

        for path in self.adapters.values():
            try:
                if AdapterConfig.from_dir(path).use_dora:
                    return True
            except MultiloraError:
                pass
        return False

    def _vocab_parts(self) -> dict:
        """Which embed_tokens / lm_head slots the run needs (layers/vocab_lora.py), from the adapters' headers:
        {} when no adapter has any; full-weight copies one per adapter that has one, at most one per slot.
        Only adapters whose config names these modules are scanned (an unreadable one: its load reports it)."""
        from multilora_cli.adapters.config import AdapterConfig
        from multilora_cli.adapters.scan import scan_adapter

        embed_lora = head_lora = False
        embed_full = head_full = 0
        for name, path in self.adapters.items():
            try:
                if not AdapterConfig.from_dir(path).names_vocab_modules():
                    continue
                scan = self._scans.get(name) or scan_adapter(path, name, self.model_config)
            except MultiloraError:
                continue
            v = scan.vocab
            embed_lora |= "embed_tokens" in v.lora
            head_lora |= "lm_head" in v.lora
            embed_full += "embed_tokens" in v.full
            head_full += "lm_head" in v.full
        if not (embed_lora or head_lora or embed_full or head_full):
            return {}
        n = self.config.max_loras
        return dict(
            embed_lora=embed_lora, head_lora=head_lora, embed_full=min(embed_full, n), head_full=min(head_full, n)
        )

    def _adapter_nbytes(self, name: str) -> int:
        """Packed size of adapter `name` in the run dtype, from its file header (no tensor is read). With the
        direct reads, also its `ReadPlan`, kept for its reads (engine/direct_read.py)."""
        from multilora_cli.adapters.tensors import TensorFile, classify_key, weights_file
        from multilora_cli.engine.direct_read import plan_read

        if self.runner.device.type == "cuda":
            try:
                rp = plan_read(
                    self.adapters[name], name, self.model_config, self.runner.dtype, scan=self._scans.pop(name, None)
                )
            except MultiloraError:
                rp = None  # invalid: its load reports it, per request; the header may still size it below
            if rp is not None:
                self._read_plans[name] = rp
                return rp.nbytes
        wfile = weights_file(self.adapters[name], name)
        if wfile.suffix != ".safetensors":
            return wfile.stat().st_size
        tf = TensorFile(wfile, name)
        numel = 0
        for key in tf.keys():
            if not isinstance(classify_key(key), str):
                n = 1
                for d in tf.shape(key):
                    n *= d
                numel += n
        return numel * self.runner.dtype.itemsize

    def _make_arena(self) -> tuple[PinnedArena | None, int, int]:
        """The page-locked host arena packed adapters live in (CUDA with adapters only; None if it cannot be
        registered: loads then take pageable memory, as they do when the arena is full), the host cache's
        size: `max_cpu_loras`, less when the arena was capped below it (pinned.host_cache_capacity), and the
        reads a wave ahead it has blocks for beside that cache (pinned.reads_ahead_capacity)."""
        cfg = self.config
        ahead = cfg.max_num_seqs  # SlotManager caps it at max_loras
        if self.runner.device.type != "cuda" or not self.adapters or not cfg.pinned_arena:
            return None, cfg.max_cpu_loras, ahead
        try:
            sizes = [self._adapter_nbytes(n) for n in self.adapters]
        except MultiloraError:
            return None, cfg.max_cpu_loras, ahead  # the load reports it, per request
        in_flight = min(cfg.max_loras, cfg.max_num_seqs)  # reads a wave ahead (SlotManager.read_ahead)
        nbytes = arena_bytes(sizes, cfg.max_cpu_loras, in_flight)
        try:
            arena = PinnedArena(nbytes, cuda=True) if nbytes else None
        except (RuntimeError, AttributeError):  # registration refused (locked-memory limit, old CUDA runtime)
            return None, cfg.max_cpu_loras, ahead
        if arena is None:
            return None, cfg.max_cpu_loras, ahead
        args = (arena.nbytes, max(sizes), cfg.max_cpu_loras, in_flight)
        return arena, host_cache_capacity(*args), reads_ahead_capacity(*args, len(sizes))

    # --- generation -------------------------------------------------------------------------------------------
    def _admit(self, request: Request) -> Result | None:
        """Tokenize and queue one request; an error Result if it cannot run at all."""
        adapter = request.adapter
        if adapter in ("", "base"):  # the contract's spellings of "no adapter"
            adapter = request.adapter = None
        if adapter is not None and adapter not in self.adapters:
            known = ", ".join(sorted(self.adapters)) or "none"
            return self._error(
                request,
                RequestError(
                    f"request {request.id}: unknown adapter {adapter!r}",
                    code="unknown_adapter",
                    hint=f"known adapters: {known}; pass it with --adapters",
                ),
            )
        try:
            request.sampling.check_token_ids(self.model_config.vocab_size)
        except ConfigError as e:
            return self._error(request, RequestError(f"request {request.id}: {e.message}", code="invalid_sampling"))
        context_len = None
        try:
            if request.sampling.constraint is not None:
                self._grammar().compiler.check(request.sampling.constraint, request.id)
            if request.is_scoring:
                ids, context_len = scoring_ids(self.tokenizer, request)
            else:
                ids = self.tokenizer.encode_request(request, self.max_model_len)  # refuses huge prompts unencoded
        except MultiloraError as e:
            return self._error(request, e)
        seq = Sequence.from_request(
            self._next_seq_id, request, ids, engine_seed=self.config.seed, context_len=context_len
        )
        seq.prefix_id = self._prefix_id(seq)
        self._next_seq_id += request.sampling.n  # the ids of its samples (Sequence.fork)
        self.scheduler.add(seq)
        return None

    def _grammar(self) -> GrammarRows:
        """The constrained rows' matchers (engine/grammar/), made once: the tokenizer's info is built then."""
        if self.grammar is None:
            compiler = GrammarCompiler.for_tokenizer(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
            self.grammar = GrammarRows(compiler, self.config.max_num_seqs, self.runner.device)
            self.runner.grammar = self.grammar
            self.stop = GrammarStop(self.stop, self.grammar, self.tokenizer)
        return self.grammar

    def _prefix_id(self, seq: Sequence) -> str | PendingIdentity | None:
        """What `seq`'s KV is cached under: its adapter's content (adapters/identity.py: the hash the --resume
        ledger records), "base" for the base model; None = no caching: the cache is off, the adapter's files
        cannot be read (its load fails the request anyway), or a LongRoPE model whose prompt is at most
        `long_rope_from` tokens (engine/long_rope.py: its first blocks are rotated short, then rewritten long in
        place when it grows past the limit, so they are neither another's hit nor safe to share). A longer
        prompt is rotated long at every position from the start, so such sequences share with each other."""
        if not self.config.prefix_cache:
            return None
        long_from = self.runner.model.long_rope_from
        if long_from is not None and seq.num_prompt_tokens <= long_from:
            return None
        name = seq.adapter
        if name is None:
            return "base"
        # hashed on a worker (engine/identities.py); the admission claims it (Admission._try_admit)
        return self.identities.start(name)

    def _error(self, request: Request, error: MultiloraError) -> Result:
        self.stats.requests += 1
        self.stats.errors += 1
        return Result(key=request.key, id=request.id, adapter=request.adapter, error=error)

    def _finished(self, seq: Sequence) -> Result | None:
        """The request's Result once `seq` was its last sample to finish (or its sample 0 failed before the
        others forked); None while samples are still running."""
        if self.grammar is not None:
            self.grammar.drop(seq)
        n = seq.sampling.n
        if n == 1:
            return self._result([seq])
        done = self._samples.setdefault(seq.request.key, [])
        done.append(seq)
        if len(done) < n and not seq.pending_forks:  # (pending forks: it failed before they started)
            return None
        del self._samples[seq.request.key]
        return self._result(sorted(done, key=lambda s: s.sample_index))

    def _result(self, seqs: list[Sequence]) -> Result:
        """One Result from a request's finished samples (index order)."""
        st, first = self.stats, seqs[0]
        st.requests += 1
        failed = next((s for s in seqs if s.error is not None), None)
        if failed is not None:
            st.errors += 1
            return Result(
                key=first.request.key,
                id=first.request.id,
                adapter=first.adapter,
                error=failed.error,
                prompt_tokens=first.num_prompt_tokens,
            )
        if first.request.is_scoring:
            st.adapter(first.adapter).add_ok(first.num_prompt_tokens, 0)
            st.prompt_tokens += first.num_prompt_tokens
            return Result(
                key=first.request.key,
                id=first.request.id,
                adapter=first.adapter,
                finish_reason=first.finish_reason,
                prompt_tokens=first.num_prompt_tokens,
                score=score_of(first),
            )
        samples = [self._sample(s) for s in seqs]
        completion = sum(s.completion_tokens for s in samples)
        st.adapter(first.adapter).add_ok(first.num_prompt_tokens, completion)
        st.prompt_tokens += first.num_prompt_tokens
        st.completion_tokens += completion
        return Result(
            key=first.request.key,
            id=first.request.id,
            adapter=first.adapter,
            text=samples[0].text,
            token_ids=samples[0].token_ids,
            finish_reason=samples[0].finish_reason,
            prompt_tokens=first.num_prompt_tokens,
            completion_tokens=completion,
            samples=samples,
            prompt_logprobs=self._prompt_logprobs(first),
            echo_text=self._echo(first),
        )

    def _echo(self, seq: Sequence) -> str | None:
        req = seq.request
        if not req.echo:
            return None
        return req.prompt if req.prompt is not None else self.tokenizer.decode(seq.prompt_token_ids)

    def _token_text(self, token_id: int) -> str:
        """A token's text as it reads after another token (special tokens kept): decoded after an anchor token
        and the anchor's text cut off, so a SentencePiece word token keeps its leading space as it has in the
        completion's text (decoded alone, "▁word" loses it). A special token is its own text. The whole
        vocabulary's texts are decoded in three batched calls the first time one is asked for (per-id decodes
        cost ~3 tokenizer calls a token: tens of seconds for a logprobs run of a 128k vocabulary)."""
        if self._token_texts is None:
            self._token_texts = self._all_token_texts()
        if 0 <= token_id < len(self._token_texts):
            return self._token_texts[token_id]
        return self.tokenizer.decode([token_id], skip_special_tokens=False)  # past the tokenizer's ids: padding

    def _all_token_texts(self) -> list[str]:
        tok = self.tokenizer
        ids = [[t] for t in range(tok.size)]
        plain = tok.decode_batch(ids, skip_special_tokens=False)
        normal = tok.decode_batch(ids, skip_special_tokens=True)  # "" for a special token
        anchor = tok.encode("a", add_special_tokens=False)
        if not anchor:
            return plain
        a_text = tok.decode(anchor[:1], skip_special_tokens=False)
        both = tok.decode_batch([[anchor[0], t] for t in range(tok.size)], skip_special_tokens=False)
        return [b[len(a_text) :] if n and b.startswith(a_text) else p for p, n, b in zip(plain, normal, both)]

    def _texts(self, ids: list[int]) -> list[str]:
        """`_token_text` of each id, by list indexing (ids past the tokenizer's: one by one)."""
        if self._token_texts is None:
            self._token_texts = self._all_token_texts()
        table = self._token_texts
        try:
            return [table[t] for t in ids]  # (ids are >= 0: argmax and top-k indices, tokens)
        except IndexError:
            return [self._token_text(t) for t in ids]

    def _prompt_logprobs(self, seq: Sequence) -> list[TokenLogprob | None] | None:
        """One entry per prompt token, the first without a logprob (nothing predicts it); None when not asked."""
        if seq.prompt_lp is None:
            return None
        ids = seq.prompt_token_ids
        first = TokenLogprob(id=ids[0], logprob=None, token=self._token_text(ids[0]))
        return [first, *entries(ids[1:], seq.prompt_lp, self._texts)]

    def _sample(self, seq: Sequence) -> Sample:
        if seq.prefill_only:  # generate False: nothing generated, as OpenAI's max_tokens 0
            return Sample(index=0, finish_reason="length", logprobs=[] if seq.logprobs is not None else None)
        ids = seq.output_token_ids
        if self.stop.stopped_by_token(seq):  # eos or a stop_token_id: counted in usage, not in text or ids
            ids = ids[:-1]
        logprobs = None
        if seq.logprobs is not None:  # one per token id (a stop token's is dropped with it)
            logprobs = seq.logprobs[: len(ids)]
        return Sample(
            index=seq.sample_index,
            text=seq.text,
            token_ids=ids,
            finish_reason=seq.finish_reason,
            completion_tokens=seq.num_completion_tokens,
            logprobs=logprobs,
        )

    def generate(self, requests: Iterable[Request]) -> Iterator[Result]:
        """Yield one Result per request, as each completes (any order). Requests are pulled lazily. The objects
        that exist when it begins are frozen for the collector meanwhile (engine/gc_heap.py)."""
        with self._heap.during():
            yield from self._generate(requests)

    def _generate(self, requests: Iterable[Request]) -> Iterator[Result]:
        it = iter(requests)
        exhausted = False
        sched = self.scheduler
        t0 = time.perf_counter()
        idle = 0
        runner = self.runner
        ahead = None  # runner.Launched: a step launched before the one before it was read back
        try:
            while True:
                t1 = time.perf_counter()
                while not exhausted and sched.wants_more():
                    try:
                        req = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    res = self._admit(req)
                    if res is not None:
                        self.feed_seconds += time.perf_counter() - t1
                        yield res
                        t1 = time.perf_counter()
                self.feed_seconds += time.perf_counter() - t1
                yield from self._results()
                if ahead is not None:
                    launched, ahead = ahead, None
                else:
                    if not sched.has_unfinished():
                        if exhausted:
                            break
                        continue
                    t1 = time.perf_counter()
                    batch = sched.schedule()
                    self.schedule_seconds += time.perf_counter() - t1
                    if batch is None:
                        idle += 1
                        if idle > 3:  # nothing runnable and nothing changes: a scheduler bug, not a user error
                            raise EngineError("the scheduler made no progress with work pending")
                        continue
                    idle = 0
                    launched = runner.launch(batch)
                t1 = time.perf_counter()
                batch = launched.batch
                nxt = sched.schedule_ahead(batch, more_requests=not exhausted) if self.config.run_ahead else None
                self.schedule_seconds += time.perf_counter() - t1
                if nxt is not None:
                    ahead = runner.launch(nxt, prev=launched)
                if self.preloads_per_step:  # the next admissions' slot loads: on the load stream, beside this step
                    t1 = time.perf_counter()
                    sched.preload(self.preloads_per_step)
                    t2 = time.perf_counter() - t1
                    self.schedule_seconds += t2
                    self.preload_seconds += t2
                ids = runner.collect(launched)
                t1 = time.perf_counter()
                self._verify(batch)
                sched.postprocess(batch, ids, self.stop)
                self.schedule_seconds += time.perf_counter() - t1
                yield from self._results()
        finally:
            # closed between two steps (at a yield): finish the step in flight, so none is left pending. Anything
            # else (Ctrl-C inside a step, an error) propagates as it is: the step before it is unfinished too
            if ahead is not None and sched.oldest_pending() is ahead.batch:
                ids = runner.collect(ahead)
                self._verify(ahead.batch)
                sched.postprocess(ahead.batch, ids, self.stop)
            self._sync_stats(time.perf_counter() - t0)

    def _verify(self, batch) -> None:
        """After a step completed, before its tokens count: an adapter whose slot load found a NaN / Inf on the
        device (its ranks were held at 0, so the step computed no row from its values) fails its sequences with
        the error a host check names, and is refused from then on."""
        if not self._device_checks:
            return
        for slot in self.runner.adapters.writer.bad_slots(batch.slots):
            name = self.slots.name_in(slot)
            if name is None:
                continue
            error = self._nonfinite_error(name)
            self.scheduler.fail_adapter(name, error)
            self.slots.refuse(name, error)

    def _nonfinite_error(self, name: str) -> MultiloraError:
        """The error `load_adapter` gives for `name`'s NaN / Inf (naming the tensor: the file is read again, once),
        or a plain one if the file reads clean now (changed on disk since)."""
        from multilora_cli.adapters.peft import load_adapter

        try:
            load_adapter(self.adapters[name], name, self.model_config, dtype=self.runner.dtype)
        except MultiloraError as e:
            return type(e)(e.message, hint=e.hint)  # its own: the caught one's traceback holds the tensors read
        return AdapterError(
            f"adapter {name!r}: {self.adapters[name]}: its values held NaN or Inf when loaded (the file reads clean "
            "now: changed on disk?)",
            hint="the adapter is broken (diverged training?); use another checkpoint",
        )

    def _results(self) -> Iterator[Result]:
        """Results of the sequences finished since the last call (their host time: `results_seconds`, the
        caller's time between yields not counted)."""
        t1 = time.perf_counter()
        for seq in self.scheduler.pop_finished():
            if (res := self._finished(seq)) is not None:
                self.results_seconds += time.perf_counter() - t1
                yield res
                t1 = time.perf_counter()
        self.results_seconds += time.perf_counter() - t1

    @property
    def slot_loads(self) -> int:
        """Adapter loads into GPU slots so far, live while generating (`stats.slot_loads` is synced at the end)."""
        return self.slots.loads

    def annotate_stats(self, stats: dict) -> None:
        """A run's hook for engine-specific stats sections: "startup", what this engine paid before its first
        step (engine/startup.py)."""
        stats["startup"] = self.startup.section(self.runner, self.arena_seconds)

    def print_summary(self, stats: dict) -> None:
        """A run's hook for engine-specific summary lines: one engine prints none."""

    def close(self) -> None:
        """Stop background adapter reads; unpin the host arena; thaw a heap freeze a run left."""
        self._heap.thaw()
        self.slots.close()
        if self._readers is not None:
            self._readers.shutdown(wait=True)
        self.identities.close()
        if self.grammar is not None:
            self.grammar.close()
        if self.arena is not None:
            self.arena.close()

    def _sync_stats(self, seconds: float) -> None:
        st, sched, slots = self.stats, self.scheduler, self.slots
        st.wall_seconds += seconds
        st.steps, st.prefill_steps, st.decode_steps = sched.num_steps, sched.num_prefill_steps, sched.num_decode_steps
        st.preemptions, st.ahead_steps = sched.num_preemptions, sched.num_ahead_steps
        st.prefix_prompt_tokens, st.prefix_hit_tokens = self.block_manager.prompt_tokens, self.block_manager.hit_tokens
        st.slot_loads, st.slot_hits, st.slot_evictions = slots.loads, slots.hits, slots.evictions
        for name, n in slots.adapter_loads.items():
            st.adapter(name).slot_loads = n

    def generate_all(self, requests: Iterable[Request]) -> list[Result]:
        """All results, in request order (convenience for library users and tests)."""
        out = list(self.generate(requests))
        out.sort(key=lambda r: r.key)
        return out

    @property
    def device(self) -> torch.device:
        return self.runner.device
