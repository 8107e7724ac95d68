"""``megakernel list``: the zoo, one line a model; ``show``'s arguments.

Each line gives the name, the family (what kind of mixer and FFN its layers
have), the layer count and the parameter count, read from the zoo cards.
"""

from __future__ import annotations


def family(card) -> str:
    """A few words for what a card's layers are, from its own fields."""
    mixer = ("MLA" if card.mla is not None else
             "hybrid linear/full attention" if card.linear_attention is not None else
             "sliding/full attention" if card.layer_types and len(set(card.layer_types)) > 1
             else "sliding-window attention" if card.sliding_window else "attention")
    ffn = f"MoE {card.moe.num_experts}x top-{card.moe.top_k}" if card.moe else "dense"
    return f"{mixer}, {ffn}"


def _count(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def cmd_list(args) -> int:
    from megakernel.models import zoo

    rows = []
    for name in zoo.names():
        card = zoo.card(name)
        rows.append((name, family(card), f"{card.num_layers} layers",
                     f"{_count(zoo.model(name).param_count)} params"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(f"{v:<{w}}" for v, w in zip(r, widths)) + "  " + r[3])
    return 0


def list_args(p) -> None:
    """``list`` takes no MODEL."""


def show_args(p) -> None:
    from megakernel.cli import args as cli_args

    cli_args.model_arg(p)
    p.add_argument("--layers", type=cli_args.int_in(1), default=None,
                   help="cut the model to its first K layers (as plan and compile do)")
