"""Test-only fault injection: changes of a generated kernel's source that a
property check must catch (and shrink), proving the check is not vacuous."""

FAULTS = {
    "skip_attention_residual": ("the attention residual add is dropped",
                                "t_x_mid = t_x + t_attn_out", "t_x_mid = t_x"),
}
