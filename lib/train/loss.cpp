// Loss dispatch and the shape rules that tie the model output to the targets.
#include "train/loss.h"

#include "ops/loss.h"

namespace gt {

void check_loss_fits(const LossConfig& loss, const Shape& output, const Dataset& data, const ConfigNode& where) {
  if (loss.type == "cross_entropy") {
    if (data.num_classes == 0)
      where.fail("cross_entropy needs class labels, but the data has regression targets (use loss: mse)");
    if (output.rank() != 1 || output[0] != data.num_classes)
      where.fail(fmt::format("cross_entropy over {} classes needs a model output of [{}], got {}", data.num_classes,
                             data.num_classes, output.str()));
  } else {
    if (data.num_classes > 0)
      where.fail("mse needs numeric targets, but the data has class labels (use loss: cross_entropy)");
    if (output.numel() != data.target_shape().numel())
      where.fail(fmt::format("mse: model output {} does not match targets {}", output.str(),
                             data.target_shape().str()));
  }
}

void compute_loss(const LossConfig& loss, const Tensor& out, const Tensor& target, double scale, Tensor& dout,
                  Tensor& stats) {
  const int64_t batch = out.dim(0);
  const Tensor out2 = out.view(Shape{batch, out.numel() / batch});
  Tensor dout2 = dout.defined() ? dout.view(out2.shape()) : Tensor();
  if (loss.type == "cross_entropy")
    ops::cross_entropy(out2, target, loss.label_smoothing, scale, dout2, stats);
  else
    ops::mse(out2, target.view(out2.shape()), scale, dout2, stats);
}

}  // namespace gt
