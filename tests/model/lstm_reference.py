"""PyTorch's ``nn.LSTM`` with a Flax ``bertjax.model.bilstm.BiLSTM``'s weights: the independent
reference the BiLSTM tests compare with (``tests/model/bilstm_test.py``,
``tests/finetune/heads_test.py``)."""

import numpy as np
import torch

GATES = "ifgo"  # PyTorch's order of the four gates in weight_ih / weight_hh / bias_hh


def torch_lstm(params: dict, features: int, hidden_size: int, num_layers: int) -> torch.nn.LSTM:
    """``nn.LSTM(bidirectional=True, batch_first=True)`` holding the BiLSTM params ``params``
    (its ``layer_{i}/{forward,backward}_rnn/cell`` tree): the gates' kernels transposed and
    stacked i, f, g, o; the hidden biases as ``bias_hh``, ``bias_ih`` zero."""
    lstm = torch.nn.LSTM(features, hidden_size, num_layers=num_layers, bidirectional=True,
                         batch_first=True)  # fmt: skip
    to_torch = lambda x: torch.tensor(np.asarray(x, np.float32))
    for i in range(num_layers):
        for direction, suffix in (("forward_rnn", ""), ("backward_rnn", "_reverse")):
            cell = params[f"layer_{i}"][direction]["cell"]
            stack = lambda kind, cell=cell: torch.cat(
                [to_torch(cell[f"{kind}{gate}"]["kernel"]).T for gate in GATES]
            )
            weights = {
                f"weight_ih_l{i}{suffix}": stack("i"),
                f"weight_hh_l{i}{suffix}": stack("h"),
                f"bias_hh_l{i}{suffix}": torch.cat(
                    [to_torch(cell[f"h{g}"]["bias"]) for g in GATES]
                ),
                f"bias_ih_l{i}{suffix}": torch.zeros(4 * hidden_size),
            }
            for name, value in weights.items():
                getattr(lstm, name).data.copy_(value)
    return lstm


def run(lstm: torch.nn.LSTM, x: np.ndarray, lengths) -> tuple[np.ndarray, np.ndarray]:
    """``x`` <float32>[N, T, D] read over each row's first ``lengths`` tokens (through
    ``pack_padded_sequence``) -> outputs <float32>[N, T, 2R] (0 on padding) and the last layer's
    final states ``[h_n forward; h_n backward]`` <float32>[N, 2R]."""
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.tensor(x), torch.tensor(lengths), batch_first=True, enforce_sorted=False
    )
    with torch.no_grad():
        out, (h_n, _) = lstm(packed)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out.numpy(), torch.cat([h_n[-2], h_n[-1]], dim=-1).numpy()
