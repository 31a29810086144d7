"""torchvision.models.resnet50's architecture, module names and initialisation in plain torch.nn
(torchvision cannot be installed beside this torch), so its state_dict keys are torchvision's: the
reference ResNet-50 of the parity tests. (The ResNet-18 reference: benchmarks/bench_vs_torch.py.)"""


def torch_resnet50(num_classes=1000):
  """torchvision's resnet50: Bottleneck blocks (1x1, 3x3 with the stride, 1x1 to 4x the channels;
  downsample = 1x1 conv + BN), (3, 4, 6, 3) per stage, kaiming fan_out convolutions, BN 1 and 0,
  no zero-initialised residual BN (torchvision's default)."""
  import torch
  from torch import nn

  class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, c, stride):
      super().__init__()
      out = c * self.expansion
      self.conv1 = nn.Conv2d(cin, c, 1, bias=False)
      self.bn1 = nn.BatchNorm2d(c)
      self.conv2 = nn.Conv2d(c, c, 3, stride, 1, bias=False)
      self.bn2 = nn.BatchNorm2d(c)
      self.conv3 = nn.Conv2d(c, out, 1, bias=False)
      self.bn3 = nn.BatchNorm2d(out)
      self.relu = nn.ReLU(inplace=True)
      self.downsample = None
      if stride != 1 or cin != out:
        self.downsample = nn.Sequential(
          nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out)
        )

    def forward(self, x):
      y = self.relu(self.bn1(self.conv1(x)))
      y = self.relu(self.bn2(self.conv2(y)))
      y = self.bn3(self.conv3(y))
      return self.relu(y + (x if self.downsample is None else self.downsample(x)))

  class ResNet50(nn.Module):
    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
      self.bn1 = nn.BatchNorm2d(64)
      self.relu = nn.ReLU(inplace=True)
      self.maxpool = nn.MaxPool2d(3, 2, 1)
      stages, cin = [], 64
      for i, (c, n) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
        blocks = [Bottleneck(cin, c, 1 if i == 0 else 2)]
        blocks += [Bottleneck(c * 4, c, 1) for _ in range(n - 1)]
        stages.append(nn.Sequential(*blocks))
        cin = c * 4
      self.layer1, self.layer2, self.layer3, self.layer4 = stages
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      self.fc = nn.Linear(2048, num_classes)
      for m in self.modules():
        if isinstance(m, nn.Conv2d):
          nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')

    def forward(self, x):
      x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
      x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
      return self.fc(torch.flatten(self.avgpool(x), 1))

  return ResNet50()
