#!/usr/bin/python
"""Ansible module: read a GGUF model's header and summarise what placement planning needs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gguf_info
short_description: Summarise a GGUF model file from its header (layers, MTP, KV and recurrent layers, tensor sizes)
version_added: "0.1.0"
description:
  - Reads the header of a GGUF file (magic, version, metadata and the tensor-info table) without reading
    any tensor data, so it takes well under a second even on a file of tens of gigabytes.
  - For a split GGUF (C(<prefix>-00001-of-0000N.gguf)), give any part; every part is found by llama.cpp's
    naming rule, its header read and the sizes summed. A missing part is an error.
  - Derives the facts the later stages need (see docs/facts.md, C(gguf_info)) the way llama.cpp does
    (commit 0c1e570) - block count including the MTP (nextn) blocks, which trunk layers hold KV cache
    (hybrid models such as qwen35 only their full-attention layers), recurrent state per layer and
    the bytes of every block, the embeddings and the output.
  - Read-only; never reports a change.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  path:
    description:
      - Path of the GGUF file on the target host, or of any part of a split GGUF set.
    type: path
    required: true
extends_documentation_fragment:
  - llamafleet.mtp.attributes.read_only
notes:
  - Fails with the file name, what is wrong and the byte offset for missing, truncated, corrupt or non-GGUF files.
"""

EXAMPLES = r"""
- name: Read the model header
  llamafleet.mtp.gguf_info:
    path: /var/lib/llama-models/qwen/Qwen3.6-27B-Q4_K_M-mtp.gguf
  register: model

- name: Refuse draft-mtp for a model without MTP layers
  ansible.builtin.assert:
    that: model.gguf.mtp
    fail_msg: "{{ model.gguf.path }} has no MTP (nextn) layers; use a GGUF converted with MTP"
"""

RETURN = r"""
gguf:
  description: Summary of the model, as documented in docs/facts.md (C(gguf_info)).
  returned: success
  type: dict
  contains:
    path:
      description: The path given (the first part for a split set is in I(split.paths)).
      type: str
    architecture:
      description: C(general.architecture), e.g. C(qwen35).
      type: str
    name:
      description: C(general.name), null when absent.
      type: str
    file_type:
      description: C(general.file_type) (llama_ftype number), null when absent.
      type: int
    file_type_name:
      description: llama_ftype name without the C(LLAMA_FTYPE_) prefix, e.g. C(MOSTLY_Q4_K_M).
      type: str
    size_bytes:
      description: Size on disk of all parts together.
      type: int
    split:
      description: C(count) parts and their C(paths), in order.
      type: dict
    tensor_count:
      description: Tensors in all parts.
      type: int
    block_count:
      description: Layers including the MTP (nextn) blocks.
      type: int
    nextn_predict_layers:
      description: MTP (nextn) blocks at the end of the stack, 0 when none.
      type: int
    mtp:
      description: Whether the file carries MTP layers (nextn_predict_layers > 0).
      type: bool
    trunk_layers:
      description: block_count - nextn_predict_layers.
      type: int
    context_length:
      description: Training context length.
      type: int
    embedding_length:
      description: n_embd.
      type: int
    feed_forward_length:
      description: FFN size, an int or a list per layer as stored.
      type: raw
    vocab_size:
      description: Length of tokenizer.ggml.tokens, or the token_embd rows.
      type: int
    head_count:
      description: Attention heads, an int or a list per layer as stored.
      type: raw
    head_count_kv:
      description: KV heads, an int or a list per layer as stored (defaults to head_count).
      type: raw
    key_length:
      description: K head size (default embedding_length / head_count).
      type: int
    value_length:
      description: V head size (default embedding_length / head_count).
      type: int
    kv_layers:
      description: Trunk layers that hold attention KV cache.
      type: list
      elements: int
    recurrent:
      description:
        - Null for models without recurrent layers. Otherwise C(layers) (trunk layers with recurrent state),
          the C(ssm) sizes, C(full_attention_interval) and C(state_bytes_per_layer) (F32 conv + recurrent state
          of one layer for one sequence row, llama.cpp n_embd_r() + n_embd_s()).
      type: dict
    tensor_bytes:
      description:
        - C(per_layer) bytes of blk.N.* for every block (MTP blocks included), C(token_embd), C(output)
          (0 when tied to token_embd), C(output_norm), C(mtp) (sum of the nextn blocks) and C(other).
      type: dict
    decode_bytes:
      description:
        - Weights one single-token decode step reads - C(token) (trunk blocks, output norm and head, one
          token_embd row; routed experts scaled by expert_used_count / expert_count), C(mtp_draft) (one MTP
          draft token - the nextn blocks plus the main output head when they have no shared_head_head; 0
          without MTP) and C(expert_fraction). The numerator of bench.yml's roofline efficiency.
      type: dict
changed:
  description: Always false.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import GGUFError, gguf_info


def main() -> None:
    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "required": True}},
        supports_check_mode=True,
    )
    try:
        info = gguf_info(module.params["path"])
    except GGUFError as e:
        module.fail_json(msg=str(e), changed=False)
    module.exit_json(changed=False, gguf=info)


if __name__ == "__main__":
    main()
