/*
 * Beam's Flink job server for a cluster whose TaskManagers already hold the job server's jars.
 *
 * Beam's FlinkJobInvoker stages every jar on the job server's class path with every job: it
 * scans the class path (PipelineResources.detectClassPathResourcesToStage, ClassGraph, which
 * follows the launcher's Class-Path) and hands the jars to Flink, which uploads them to the
 * JobManager's blob server and has each TaskManager download them into a user-code class loader.
 * The assembled job server has 161 jars (152 MB) and that took about 15 s of every job on the
 * standalone cluster of pipelines/engines/flink_cluster.py, whose TaskManager runs on those same
 * jars. Beam reads the detector from an option (pipelineResourcesDetectorFactoryClass) that
 * pipeline options sent by the Python SDK cannot set (@JsonIgnore), and FlinkJobServerDriver
 * takes the files to stage from no flag, so this main class wraps the driver with an invoker
 * that stages nothing.
 *
 * Staging is skipped only when the JVM runs with -Desa.flink.clusterHoldsJobServerJars=true
 * (runners.runner_flags sets it for the flink and flink_cluster engines); without it this is
 * Beam's own FlinkJobServerDriver, unchanged, so a cluster that lacks the jars still receives them.
 * scripts/engines.sh compiles this file against the assembled jars and names it the launcher's
 * Main-Class. It is in Beam's package because the server configuration's getters for the Flink
 * master and configuration directory are package-private.
 */
package org.apache.beam.runners.flink;

import java.util.Collections;
import java.util.UUID;
import org.apache.beam.model.pipeline.v1.RunnerApi;
import org.apache.beam.runners.jobsubmission.JobInvocation;
import org.apache.beam.sdk.io.FileSystems;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.PortablePipelineOptions;
import org.apache.beam.sdk.util.construction.PipelineOptionsTranslation;
import org.apache.beam.vendor.grpc.v1p60p1.com.google.protobuf.Struct;
import org.apache.beam.vendor.guava.v32_1_2_jre.com.google.common.util.concurrent.ListeningExecutorService;

public final class PrestagedJobServer {
  /** The JVM property that says the cluster's TaskManagers hold every jar of the job server. */
  public static final String CLUSTER_HOLDS_JARS = "esa.flink.clusterHoldsJobServerJars";

  private PrestagedJobServer() {}

  public static void main(String[] args) throws Exception {
    if (!Boolean.getBoolean(CLUSTER_HOLDS_JARS)) {
      FlinkJobServerDriver.main(args);
      return;
    }
    FileSystems.setDefaultPipelineOptions(PipelineOptionsFactory.create());
    FlinkJobServerDriver.FlinkServerConfiguration configuration =
        FlinkJobServerDriver.parseArgs(args);
    FlinkJobServerDriver.fromConfig(configuration, () -> new UnstagedInvoker(configuration))
        .run();
  }

  /** FlinkJobInvoker's invocation, with an empty list of files to stage. */
  static final class UnstagedInvoker extends FlinkJobInvoker {
    private final FlinkJobServerDriver.FlinkServerConfiguration configuration;

    UnstagedInvoker(FlinkJobServerDriver.FlinkServerConfiguration configuration) {
      super(configuration);
      this.configuration = configuration;
    }

    @Override
    protected JobInvocation invokeWithExecutor(
        RunnerApi.Pipeline pipeline,
        Struct options,
        String retrievalToken,
        ListeningExecutorService executorService) {
      FlinkPipelineOptions flinkOptions =
          PipelineOptionsTranslation.fromProto(options).as(FlinkPipelineOptions.class);
      String executable = flinkOptions.as(PortablePipelineOptions.class).getOutputExecutablePath();
      if (executable != null && !executable.isEmpty()) {
        // A pipeline jar to write, not a job to run: Beam's own invoker does that.
        return super.invokeWithExecutor(pipeline, options, retrievalToken, executorService);
      }
      if (FlinkPipelineOptions.AUTO.equals(flinkOptions.getFlinkMaster())) {
        flinkOptions.setFlinkMaster(configuration.getFlinkMaster());
      }
      FlinkPipelineRunner runner =
          new FlinkPipelineRunner(
              flinkOptions, configuration.getFlinkConfDir(), Collections.emptyList());
      String invocationId = flinkOptions.getJobName() + "_" + UUID.randomUUID();
      flinkOptions.setRunner(null);
      return createJobInvocation(
          invocationId, retrievalToken, executorService, pipeline, flinkOptions, runner);
    }
  }
}
