"""A real Lightning Trainer.fit on a tiny model: what test_doctor_runs.py runs the doctor on."""
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                       torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                       torch.nn.Linear(8, 10))

    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(256, 3, 16, 16), torch.randint(0, 10, (256,)))
    trainer = L.Trainer(max_steps=14, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Tiny(), DataLoader(data, batch_size=16, num_workers=0))
    print("fit done")
