"""experiments/numerics_probe.py's Markdown report: products by reduction length, layers, the
model, pairs.
"""


def fmt(v):
  return 'n/a' if v is None else ('0' if v == 0 else f'{v:.2e}')


def markdown(result, matmul_k):
  """The Markdown report: products by reduction length (the matmuls' `matmul_k`), layers, model,
  pairs."""
  from analysis.words import tables  # pandas: loaded once the probe has measured

  settings, info = result['settings'], result['info']
  lines = [
    f'## Numerics on {info["platform"]} ({info["device_kind"]}), jax {info["jax"]}\n',
    'Relative L2 error against float64.\n',
    '### Matmuls [rows, K] @ [K, cols]\n',
  ]
  lines.append(
    tables.markdown(
      [
        {'setting': s, **{f'K={k}': fmt(result['matmul'][s][k]) for k in matmul_k}}
        for s in settings
      ]
    )
  )
  lines.append('\n### ResNet-18 layers (K = reduction length)\n')
  lines.append(
    tables.markdown(
      [
        {'layer': r['name'], 'K': str(r['K']), **{s: fmt(r[s]) for s in settings}}
        for r in result['layers']
      ]
    )
  )
  if result['model']:
    lines.append('\n### Small ResNet-18, one training-mode step\n')
    lines.append(
      tables.markdown(
        [
          {
            'setting': s,
            'logits': fmt((e or {}).get('logits')),
            'grads': fmt((e or {}).get('grads')),
          }
          for s, e in result['model'].items()
        ]
      )
    )
  lines.append('\n### Emulated vs native (relative L2 difference; products: worst case)\n')
  lines.append(
    tables.markdown(
      [{k: (v if isinstance(v, str) else fmt(v)) for k, v in r.items()} for r in result['pairs']]
    )
  )
  return '\n'.join(lines)
