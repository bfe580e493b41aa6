// Starts the SQS emulator on 127.0.0.1 and prints its endpoint on the first line of
// stdout. Port: first argument or SQS_PORT, 0 (the default) picks a free one. The
// process exits when its standard input closes, so it never outlives the process that
// started it.
"use strict";
const { createSqsServer } = require("local-aws-sqs");

const port = Number(process.argv[2] || process.env.SQS_PORT || 0);

createSqsServer({ port, hostname: "127.0.0.1", emulateQueueCreationLifecycle: false })
  .then((server) => {
    const addr = server.address();
    process.stdout.write(`http://127.0.0.1:${addr.port}\n`);
    process.stdin.on("end", () => process.exit(0));
    process.stdin.on("error", () => process.exit(0));
    process.stdin.resume();
  })
  .catch((err) => {
    console.error(err);
    process.exit(1);
  });
