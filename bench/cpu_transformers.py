"""The transformers bench/cpu.py and bench/cpu_profile.py run, in plain torch (no transformers or torchvision):
`build(name, layers)` -> (module, example input) with torch's default random initialisation.

- "bert": BERT-base-shaped post-norm encoder (word, position and type embeddings, LayerNorm, `layers` blocks of d 768,
  12 heads, FF 3072, exact GELU) over 128 token ids; the last hidden states [1, 128, 768].
- "gpt2": GPT-2-small-shaped pre-norm decoder (50257 words, 1024 positions, causal attention, tanh GELU, final
  LayerNorm) over a 128-token prompt; the next token's logits through the tied embedding [1, 50257].
- "vit": ViT-B/16 (16x16 patches of a 224x224 image, class token, 197 positions, pre-norm blocks, exact GELU, final
  LayerNorm, 1000-class head on the class token) [1, 1000].
"""
import torch

nn = torch.nn
F = torch.nn.functional
D, HEADS, FF, SEQ = 768, 12, 3072, 128


class SelfAttention(nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.qkv, self.out, self.causal = nn.Linear(D, 3 * D), nn.Linear(D, D), causal

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (y.reshape(b, t, HEADS, D // HEADS).transpose(1, 2) for y in self.qkv(x).split(D, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, t, D))


class Block(nn.Module):
    """pre=True: x + attn(ln1(x)), then x + mlp(ln2(x)) (GPT-2, ViT); pre=False: ln1(x + attn(x)), then
    ln2(x + mlp(x)) (BERT)."""

    def __init__(self, pre, causal=False, gelu="none"):
        super().__init__()
        self.ln1, self.ln2, self.pre = nn.LayerNorm(D, eps=1e-5 if pre else 1e-12), nn.LayerNorm(D), pre
        self.attn = SelfAttention(causal)
        self.mlp = nn.Sequential(nn.Linear(D, FF), nn.GELU(approximate=gelu), nn.Linear(FF, D))

    def forward(self, x):
        if self.pre:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class Bert(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.words, self.positions, self.types = nn.Embedding(30522, D), nn.Embedding(512, D), nn.Embedding(2, D)
        self.ln = nn.LayerNorm(D, eps=1e-12)
        self.blocks = nn.Sequential(*[Block(pre=False) for _ in range(layers)])

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.words(ids) + self.positions(pos) + self.types(torch.zeros_like(ids))
        return self.blocks(self.ln(x))


class Gpt2(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.words, self.positions = nn.Embedding(50257, D), nn.Embedding(1024, D)
        nn.init.normal_(self.words.weight, std=0.02)
        self.blocks = nn.Sequential(*[Block(pre=True, causal=True, gelu="tanh") for _ in range(layers)])
        self.ln = nn.LayerNorm(D)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        h = self.ln(self.blocks(self.words(ids) + self.positions(pos)))
        return h[:, -1] @ self.words.weight.t()


class Vit(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.patch = nn.Conv2d(3, D, 16, stride=16)
        self.cls = nn.Parameter(torch.randn(1, 1, D) * 0.02)
        self.positions = nn.Parameter(torch.randn(1, 197, D) * 0.02)
        self.blocks = nn.Sequential(*[Block(pre=True) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(D, eps=1e-6), nn.Linear(D, 1000)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        return self.head(self.ln(self.blocks(x))[:, 0])


def build(name, layers=12):
    """(module, example input) of "bert", "gpt2" or "vit" with `layers` blocks."""
    gen = torch.Generator().manual_seed(1)
    if name == "vit":
        return Vit(layers), torch.randn(1, 3, 224, 224, generator=gen)
    vocab = 30522 if name == "bert" else 50257
    ids = torch.randint(0, vocab, (1, SEQ), generator=gen)
    return (Bert if name == "bert" else Gpt2)(layers), ids
