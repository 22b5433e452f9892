#include "parallel/pipeline.h"

namespace engine::ops {

namespace {

void stage_input_grad(GradBuilder& gb, const Node& node) {
  const ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  GradBuilder::Target t = gb.target(node.inputs[0]);
  gb.emit(kStageInputGrad, {dy}, {t.value}, t, {}, node.name);
}

// The seed: x's gradient is what the next stage sent (inputs[1]).
void stage_output_grad(GradBuilder& gb, const Node& node) {
  GradBuilder::Target t = gb.target(node.inputs[0]);
  gb.emit(kStageOutputGrad, {node.inputs[1]}, {t.value}, t, {}, node.name);
}

void pipeline_not_on_gpu(const Node& node, const KernelContext&) {
  throw UserError(node.name + ": pipeline parallelism is not on the GPU yet");
}

double no_flops(const Graph&, const Node&) { return 0.0; }

}  // namespace

const OpDef kStageInput{.name = "stage_input",
                        .cpu = copy_kernel,
                        .cuda = pipeline_not_on_gpu,
                        .grad = stage_input_grad,
                        .flops = no_flops,
                        .native_16bit = "fp32 in, rounded once to the graph's type",
                        .any_float_inputs = true};
const OpDef kStageInputGrad{.name = "stage_input_grad",
                            .cpu = copy_kernel,
                            .cuda = pipeline_not_on_gpu,
                            .flops = no_flops,
                            .native_16bit = "widened to fp32 exactly"};
const OpDef kStageOutput{.name = "stage_output",
                         .cpu = copy_kernel,
                         .cuda = pipeline_not_on_gpu,
                         .grad = stage_output_grad,
                         .flops = no_flops,
                         .native_16bit = "widened to fp32 exactly",
                         .fp32_outputs = 0b1,
                         .any_float_inputs = true};
const OpDef kStageOutputGrad{.name = "stage_output_grad",
                             .cpu = copy_kernel,
                             .cuda = pipeline_not_on_gpu,
                             .flops = no_flops,
                             .native_16bit = "fp32 in, rounded once to the graph's type"};

ValueId stage_input(Graph& g, ValueId received, const std::string& name) {
  const Value& v = g.value(received);
  if (v.dtype != DType::f32 || v.placement != Placement::input)
    shape_error(name, "a stage's received activation is an fp32 input");
  g.mark_differentiable(received);
  ValueId x = g.add_activation(name + ".out", v.shape);
  g.add_node(Node{&kStageInput, {received}, {x}, {}, false, false, name});
  return x;
}

ValueId stage_output(Graph& g, ValueId x, ValueId received_gradient, const std::string& name) {
  const Value& v = g.value(x);
  if (g.value(received_gradient).shape != v.shape) shape_error(name, "the received gradient's shape is not x's");
  ValueId out = g.add_activation(name + ".out", v.shape);
  g.add_node(Node{&kStageOutput, {x, received_gradient}, {out}, {}, false, false, name});
  return out;
}

}  // namespace engine::ops
