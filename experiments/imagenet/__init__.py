"""ImageNet building blocks of the `resnet50_imagenet_ctl` experiment.

One concept per module:

    input_pipeline   ImageNet TFRecords (or synthetic images) -> batches
    resnet50         the ResNet50 v1.5 model builder, registered as a model
    schedule         SGD with the reference's warmup-and-step learning rate
    ctl_trainer      the `resnet_ctl` trainer: epochs, throughput, profiling
    export           checkpoint -> classification / feature-vector SavedModels
    reference_flags  every flag of the reference runner, short names included
    reference_runner those flags and the reference's stats, mapped onto ours

Only the first four are imported by the experiment (and so by
`registry_imports`); `export` and the `reference_*` modules serve the
launchers.
"""
