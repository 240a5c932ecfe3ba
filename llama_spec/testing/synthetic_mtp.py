"""A deterministic tiny qwen35 GGUF with an MTP (nextn) head whose agreement with the trunk is tunable.

Layout (what llama.cpp 0c1e57098's ``qwen35`` loader expects, ``src/models/qwen35.cpp``):

* block 0: Gated-DeltaNet (recurrent) block, block 1: full-attention block — the trunk;
* block 2: the MTP block: the tensors of a full-attention block plus ``nextn.eh_proj``
  (2·n_embd → n_embd), ``nextn.enorm``, ``nextn.hnorm`` and ``nextn.shared_head_norm``;
  ``qwen35.block_count = 3``, ``qwen35.nextn_predict_layers = 1``,
  ``qwen35.attention.recurrent_layers = [true, false, false]``.

Weights: every matrix inside the blocks is N(0, 1e-3²) and every norm weight is 1, so each block
adds only ~1e-4 to the residual stream: the trunk is (almost exactly) a *bigram* model,
``p(x_{t+1} | x_t) = softmax(W_out · rmsnorm(E[x_t]))``, with a random token embedding ``E`` and a
random output matrix ``W_out`` scaled so that the logits have standard deviation ``logit_std``
(default 4.5: at temperature 0.8 the top token gets ~0.2–0.8 of the mass, median ~0.4).

The MTP graph computes ``eh_proj · concat(enorm(E[x_{t+1}]), hnorm(h_t))``; with
``eh_proj = [I | 0]`` the head outputs ``W_out · rmsnorm(E[x_{t+1}])`` — exactly what the trunk
will predict one position later — so q ≈ p (100 % greedy acceptance). Gaussian noise of standard
deviation ``sigma`` added to every entry of ``eh_proj`` makes q drift away from p. The noise comes
from its own random stream, so models with the same seed and different sigma share every other
tensor byte for byte (same trunk, same p).

The tokenizer is a real one: SmolLM2's (``tokenizer.ggml.*``, 49,152 tokens, ChatML), copied from
the SmolLM2 test model, plus two USER_DEFINED tokens ``<think>`` and ``</think>`` appended at the
end (ids 49152 and 49153) so that they always tokenize as single tokens (n_vocab 49,154).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "GENERATOR_VERSION",
    "THINKING_TEMPLATE",
    "THINK_TOKENS",
    "write_synthetic_mtp",
    "synthetic_mtp_path",
]

#: Bump when the bytes written for given parameters change (it is part of the cache file name).
GENERATOR_VERSION = 1

ARCH = "qwen35"
THINK_TOKENS = ("<think>", "</think>")
_TOKEN_TYPE_USER_DEFINED = 4

# Qwen3's chat template (llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja) with the generation
# prompt of Qwen3.5 (models/templates/Qwen3.5-4B.jinja): the assistant turn opens ``<think>\n``
# unless ``enable_thinking`` is false, in which case an empty think block is emitted.
THINKING_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""

# Shapes (the ones llama.cpp's own tests/test-llama-archs.cpp uses for qwen35, n_embd 256).
N_HEAD = 2
N_HEAD_KV = 2
N_FF = 512
N_CTX_TRAIN = 4096
SSM_D_CONV = 4
SSM_D_STATE = 128  # head_k_dim == head_v_dim
SSM_N_GROUP = 2  # key heads
SSM_DT_RANK = 2  # value heads
ROPE_DIM = 64  # partial rotary, as in Qwen3.5
ROPE_SECTIONS = (11, 11, 10, 0)  # pairs, sum = ROPE_DIM / 2
RMS_EPS = 1e-6
WEIGHT_STD = 1e-3  # every block matrix
N_TRUNK = 2


def _tokenizer_fields(src: Path) -> tuple[tuple[str, Any, list], ...]:
    """``(key, value, types)`` of every ``tokenizer.*`` key of a GGUF file, in file order."""
    st = Path(src).stat()
    return _read_tokenizer_fields(str(src), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_tokenizer_fields(src: str, size: int, mtime_ns: int) -> tuple[tuple[str, object, list], ...]:
    from gguf import GGUFReader  # reading 49k token strings takes ~2.5 s: done once per file

    reader = GGUFReader(src)
    out = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            out.append((key, field.contents(), list(field.types)))
    if not any(k == "tokenizer.ggml.tokens" for k, _, _ in out):
        raise ValueError(f"{src}: no tokenizer.ggml.tokens")
    return tuple(out)


def _add_tokenizer(writer: Any, src: Path, chat_template: str | None) -> tuple[int, dict[str, int]]:
    from gguf import GGUFValueType

    fields = _tokenizer_fields(src)
    tokens = list(next(v for k, v, _ in fields if k == "tokenizer.ggml.tokens"))
    added: dict[str, int] = {}
    for t in THINK_TOKENS:
        if t in tokens:
            added[t] = tokens.index(t)
        else:
            added[t] = len(tokens)
            tokens.append(t)
    n_new = len(tokens) - len(next(v for k, v, _ in fields if k == "tokenizer.ggml.tokens"))
    wrote_template = False
    for key, value, types in fields:
        if key == "tokenizer.ggml.tokens":
            value = tokens
        elif key == "tokenizer.ggml.token_type":
            value = list(value) + [_TOKEN_TYPE_USER_DEFINED] * n_new
        elif key == "tokenizer.ggml.scores":
            value = list(value) + [0.0] * n_new
        elif key == "tokenizer.chat_template":
            wrote_template = True
            if chat_template is not None:
                value = chat_template
        if types[0] == GGUFValueType.ARRAY:
            writer.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=types[1])
        else:
            writer.add_key_value(key, value, types[0])
    if not wrote_template and chat_template is not None:
        writer.add_key_value("tokenizer.chat_template", chat_template, GGUFValueType.STRING)
    return len(tokens), added


def _f16(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float16)


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _add_hparams(w: Any, n_vocab: int, n_embd: int) -> None:
    """The qwen35 hyperparameters of the synthetic model (2 trunk blocks + 1 MTP block)."""
    from gguf import GGUFValueType

    head_dim = n_embd // N_HEAD
    ssm_d_inner = SSM_D_STATE * SSM_DT_RANK
    a = f"{ARCH}."
    w.add_uint32(a + "vocab_size", n_vocab)
    w.add_uint32(a + "context_length", N_CTX_TRAIN)
    w.add_uint32(a + "embedding_length", n_embd)
    w.add_uint32(a + "block_count", N_TRUNK + 1)
    w.add_uint32(a + "nextn_predict_layers", 1)
    w.add_uint32(a + "feed_forward_length", N_FF)
    w.add_uint32(a + "attention.head_count", N_HEAD)
    w.add_uint32(a + "attention.head_count_kv", N_HEAD_KV)
    w.add_uint32(a + "attention.key_length", head_dim)
    w.add_uint32(a + "attention.value_length", head_dim)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", RMS_EPS)
    w.add_key_value(
        a + "attention.recurrent_layers",
        [True, False, False],
        GGUFValueType.ARRAY,
        sub_type=GGUFValueType.BOOL,
    )
    w.add_uint32(a + "full_attention_interval", 2)
    w.add_uint32(a + "rope.dimension_count", ROPE_DIM)
    w.add_key_value(
        a + "rope.dimension_sections",
        list(ROPE_SECTIONS),
        GGUFValueType.ARRAY,
        sub_type=GGUFValueType.INT32,
    )
    w.add_float32(a + "rope.freq_base", 10_000_000.0)
    w.add_uint32(a + "ssm.conv_kernel", SSM_D_CONV)
    w.add_uint32(a + "ssm.inner_size", ssm_d_inner)
    w.add_uint32(a + "ssm.state_size", SSM_D_STATE)
    w.add_uint32(a + "ssm.time_step_rank", SSM_DT_RANK)
    w.add_uint32(a + "ssm.group_count", SSM_N_GROUP)



def _tensors(seed: int, sigma: float, n_vocab: int, n_embd: int, logit_std: float) -> list[tuple[str, np.ndarray]]:
    """Every tensor of the synthetic model, in file order (same arguments -> same arrays)."""
    head_dim = n_embd // N_HEAD
    ssm_d_inner = SSM_D_STATE * SSM_DT_RANK
    key_dim = SSM_D_STATE * SSM_N_GROUP
    value_dim = ssm_d_inner
    conv_dim = 2 * key_dim + value_dim
    rng = np.random.default_rng([seed, 0])  # everything but the eh_proj noise
    noise_rng = np.random.default_rng([seed, 1])

    def mat(rows: int, cols: int) -> np.ndarray:  # numpy (rows, cols) == ggml ne {cols, rows}
        return _f16(rng.standard_normal((rows, cols), dtype=np.float32) * WEIGHT_STD)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    tensors: list[tuple[str, np.ndarray]] = []
    add = tensors.append

    add(("token_embd.weight", _f16(rng.standard_normal((n_vocab, n_embd), dtype=np.float32))))
    add(("output_norm.weight", ones(n_embd)))
    out_scale = logit_std / np.sqrt(n_embd)
    add(("output.weight", _f16(rng.standard_normal((n_vocab, n_embd), dtype=np.float32) * out_scale)))

    def attn_block(il: int) -> None:
        p = f"blk.{il}."
        add((p + "attn_norm.weight", ones(n_embd)))
        add((p + "post_attention_norm.weight", ones(n_embd)))
        add((p + "attn_q.weight", mat(head_dim * N_HEAD * 2, n_embd)))  # query + gate
        add((p + "attn_k.weight", mat(head_dim * N_HEAD_KV, n_embd)))
        add((p + "attn_v.weight", mat(head_dim * N_HEAD_KV, n_embd)))
        add((p + "attn_output.weight", mat(n_embd, head_dim * N_HEAD)))
        add((p + "attn_q_norm.weight", ones(head_dim)))
        add((p + "attn_k_norm.weight", ones(head_dim)))

    def ffn(il: int) -> None:
        p = f"blk.{il}."
        add((p + "ffn_gate.weight", mat(N_FF, n_embd)))
        add((p + "ffn_up.weight", mat(N_FF, n_embd)))
        add((p + "ffn_down.weight", mat(n_embd, N_FF)))

    # block 0: Gated DeltaNet
    p = "blk.0."
    add((p + "attn_norm.weight", ones(n_embd)))
    add((p + "post_attention_norm.weight", ones(n_embd)))
    add((p + "attn_qkv.weight", mat(conv_dim, n_embd)))
    add((p + "attn_gate.weight", mat(value_dim, n_embd)))
    add((p + "ssm_conv1d.weight", _f32(rng.standard_normal((conv_dim, SSM_D_CONV)) * WEIGHT_STD)))
    add((p + "ssm_dt.bias", np.zeros(SSM_DT_RANK, dtype=np.float32)))
    add((p + "ssm_a", _f32(-rng.uniform(1.0, 16.0, SSM_DT_RANK))))  # -exp(A_log) < 0
    add((p + "ssm_beta.weight", mat(SSM_DT_RANK, n_embd)))
    add((p + "ssm_alpha.weight", mat(SSM_DT_RANK, n_embd)))
    add((p + "ssm_norm.weight", ones(SSM_D_STATE)))
    add((p + "ssm_out.weight", mat(n_embd, value_dim)))
    ffn(0)
    # block 1: full attention
    attn_block(1)
    ffn(1)
    # block 2: the MTP block
    attn_block(2)
    ffn(2)
    eh = np.zeros((n_embd, 2 * n_embd), dtype=np.float32)
    eh[:, :n_embd] = np.eye(n_embd, dtype=np.float32)  # [I | 0]: embedding half first
    noise = noise_rng.standard_normal(eh.shape, dtype=np.float32)
    if sigma > 0:
        eh += noise * np.float32(sigma)
    add(("blk.2.nextn.eh_proj.weight", _f16(eh)))
    add(("blk.2.nextn.enorm.weight", ones(n_embd)))
    add(("blk.2.nextn.hnorm.weight", ones(n_embd)))
    add(("blk.2.nextn.shared_head_norm.weight", ones(n_embd)))

    return tensors


def write_synthetic_mtp(
    path: os.PathLike | str,
    *,
    seed: int = 0,
    sigma: float = 0.0,
    n_embd: int = 256,
    chat_template: str | None = None,
    tokenizer_from: os.PathLike | str | None = None,
    logit_std: float = 4.5,
) -> Path:
    """Write the synthetic qwen35 + MTP model to ``path`` (atomically) and return ``path``.

    Same arguments → byte-identical file. ``chat_template=None`` keeps the template of the
    tokenizer source (SmolLM2's ChatML one); pass ``THINKING_TEMPLATE`` for a Qwen3-style
    thinking template. ``tokenizer_from`` is a GGUF whose ``tokenizer.*`` keys are copied
    (default: the SmolLM2 test model, fetched if needed).
    """
    from gguf import GGUFWriter

    if n_embd % (N_HEAD * 2) or n_embd < 2 * ROPE_DIM:
        raise ValueError(f"n_embd must be a multiple of {N_HEAD * 2} and >= {2 * ROPE_DIM}")
    if sigma < 0:
        raise ValueError("sigma must be >= 0")
    if tokenizer_from is None:
        from .models import model_path

        tokenizer_from = model_path("smollm2-135m")
    path = Path(path)
    tok_src = Path(tokenizer_from)

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        w = GGUFWriter(tmp, ARCH)
        w.add_name("llama-spec synthetic qwen35 + MTP")
        w.add_file_type(1)  # MOSTLY_F16
        w.add_uint32("llama_spec.synthetic.version", GENERATOR_VERSION)
        w.add_uint32("llama_spec.synthetic.seed", seed)
        w.add_float32("llama_spec.synthetic.sigma", float(sigma))
        w.add_float32("llama_spec.synthetic.logit_std", float(logit_std))

        n_vocab, _ = _add_tokenizer(w, tok_src, chat_template)

        _add_hparams(w, n_vocab, n_embd)
        tensors = _tensors(seed, sigma, n_vocab, n_embd, logit_std)

        for name, t in tensors:
            w.add_tensor(name, t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def synthetic_mtp_path(sigma: float = 0.0, seed: int = 0, thinking: bool = False) -> Path:
    """The synthetic model for these parameters, generated once into the model cache dir.

    File name: ``synthetic-mtp-qwen35-v<GENERATOR_VERSION>-seed<seed>-sigma<sigma>[-think].gguf``.
    """
    from ..models.registry import cache_dir
    from ..models.registry import file_lock as _lock

    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    name = f"synthetic-mtp-qwen35-v{GENERATOR_VERSION}-seed{seed}-sigma{sigma:g}{'-think' if thinking else ''}.gguf"
    path = root / name
    if path.is_file():
        return path
    with _lock(root / f".{name}.lock"):
        if not path.is_file():
            write_synthetic_mtp(
                path, seed=seed, sigma=sigma, chat_template=THINKING_TEMPLATE if thinking else None
            )
    return path
