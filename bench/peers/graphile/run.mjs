// graphile-worker's side of sked-bench's `peer` workload: queues no-op jobs, or drains them
// with one worker in this process. sked-bench installs graphile-worker and Node 22 into a
// directory of its own (`--modules DIR`) and runs this file with that Node:
//
//   node run.mjs queue --modules DIR --jobs N
//   node run.mjs drain --modules DIR --concurrency C --local-queue-size Q
//        [--complete-job-batch-delay MS] [--fail-job-batch-delay MS] [--max-pool-size P]
//
// The database is DATABASE_URL. `queue` migrates graphile-worker's schema and adds N jobs of
// the task `noop` with `addJobs`, 10,000 per call. `drain` runs until SIGTERM or SIGINT, then
// shuts down gracefully. Each prints one line on stdout, `SKED_BENCH_RESULT <json>`; the
// worker's warnings and errors go to stderr.

import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    modules: { type: "string" },
    jobs: { type: "string" },
    concurrency: { type: "string" },
    "local-queue-size": { type: "string" },
    "complete-job-batch-delay": { type: "string", default: "0" },
    "fail-job-batch-delay": { type: "string", default: "0" },
    "max-pool-size": { type: "string", default: "10" },
  },
});

function fail(message) {
  console.error(`run.mjs: ${message}`);
  process.exit(2);
}

function int(name) {
  const text = opts[name];
  const n = Number(text);
  if (text === undefined || !Number.isInteger(n)) {
    fail(`--${name} must be an integer, got ${text}`);
  }
  return n;
}

function result(fields) {
  console.log(`SKED_BENCH_RESULT ${JSON.stringify(fields)}`);
}

const mode = positionals[0];
if (!opts.modules) fail("--modules DIR (where graphile-worker is installed) is required");
const connectionString = process.env.DATABASE_URL;
if (!connectionString) fail("DATABASE_URL is not set");

// graphile-worker lives in the install directory, not next to this file.
const modules = join(opts.modules, "node_modules");
const entry = createRequire(join(opts.modules, "package.json")).resolve("graphile-worker");
const { Logger, makeWorkerUtils, run } = await import(pathToFileURL(entry).href);
const version = JSON.parse(
  readFileSync(join(modules, "graphile-worker", "package.json"), "utf8"),
).version;

// Warnings and errors only, one line each, on stderr.
const logger = new Logger((scope) => (level, message) => {
  if (level === "error" || level === "warning") {
    const where = scope.label ? ` [${scope.label}]` : "";
    console.error(`graphile-worker ${level}${where}: ${message}`);
  }
});

if (mode === "queue") {
  const jobs = int("jobs");
  const utils = await makeWorkerUtils({ connectionString, logger });
  try {
    await utils.migrate();
    const chunk = 10_000;
    for (let done = 0; done < jobs; done += chunk) {
      const specs = Array.from({ length: Math.min(chunk, jobs - done) }, () => ({
        identifier: "noop",
        payload: {},
      }));
      await utils.addJobs(specs);
    }
  } finally {
    await utils.release();
  }
  result({ mode, version, node: process.version, queued: jobs });
  process.exit(0);
} else if (mode === "drain") {
  const concurrency = int("concurrency");
  const localQueueSize = int("local-queue-size");
  const completeJobBatchDelay = int("complete-job-batch-delay");
  const failJobBatchDelay = int("fail-job-batch-delay");
  const maxPoolSize = int("max-pool-size");
  let ran = 0;
  let errors = 0;
  let firstError = null;
  // A signal that comes before the runner has started stops it as soon as it has.
  let runner = null;
  let stopping = null;
  const stop = () => {
    if (runner) stopping ??= runner.stop();
  };
  let signalled = false;
  for (const signal of ["SIGTERM", "SIGINT"]) {
    process.on(signal, () => {
      signalled = true;
      stop();
    });
  }
  const events = new EventEmitter();
  events.on("job:error", ({ error }) => {
    errors += 1;
    firstError ??= String(error?.message ?? error);
  });
  runner = await run({
    connectionString,
    concurrency,
    maxPoolSize,
    logger,
    events,
    noHandleSignals: true,
    taskList: {
      noop: async () => {
        ran += 1;
      },
    },
    preset: {
      worker: {
        localQueue: { size: localQueueSize },
        completeJobBatchDelay,
        failJobBatchDelay,
      },
    },
  });
  if (signalled) stop();
  await runner.promise;
  await stopping;
  result({
    mode,
    version,
    node: process.version,
    concurrency,
    local_queue_size: localQueueSize,
    complete_job_batch_delay: completeJobBatchDelay,
    fail_job_batch_delay: failJobBatchDelay,
    max_pool_size: maxPoolSize,
    ran,
    errors,
    first_error: firstError,
  });
  process.exit(0);
} else {
  fail(`the first argument must be "queue" or "drain", got ${mode}`);
}
