"""ImageNet building blocks of the `resnet50_imagenet_ctl` experiment.

One concept per module:

    input_pipeline   ImageNet TFRecords (or synthetic images) -> batches
    resnet50         the ResNet50 v1.5 model builder, registered as a model
    schedule         SGD with the reference's warmup-and-step learning rate
    ctl_trainer      the `resnet_ctl` trainer: epochs, throughput, profiling
    export           checkpoint -> classification / feature-vector SavedModels
    reference_runner the reference runner's flags and stats, mapped onto ours

Only the first four are imported by the experiment (and so by
`registry_imports`); `export` and `reference_runner` serve the launchers.
"""
