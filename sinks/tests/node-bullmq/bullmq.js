// The BullMQ side of tests/bullmq.rs, run with the release named by BULLMQ_PACKAGE
// (`bullmq-5` or `bullmq-6`, the aliases in package.json):
//
//   node bullmq.js add <redis-url> <prefix> <queue> <name> <job-id> <data-json> <attempts>
//       Queue.add(name, data, { jobId, attempts }), as an application using BullMQ would.
//   node bullmq.js work <redis-url> <prefix> <queue> <count>
//       An unmodified Worker runs jobs until <count> have completed, printing each as a JSON
//       line { id, name, data, attemptsMade }, then the queue's job counts.
'use strict';

const { Queue, Worker } = require(process.env.BULLMQ_PACKAGE || 'bullmq-6');
const IORedis = require('ioredis');

function connection(url) {
  return new IORedis(url, { maxRetriesPerRequest: null });
}

async function add([url, prefix, queueName, name, jobId, data, attempts]) {
  const queue = new Queue(queueName, { connection: connection(url), prefix });
  const job = await queue.add(name, JSON.parse(data), { jobId, attempts: Number(attempts) });
  console.log(JSON.stringify({ id: job.id }));
  await queue.close();
}

async function work([url, prefix, queueName, count]) {
  const wanted = Number(count);
  let completed = 0;
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  const worker = new Worker(
    queueName,
    async (job) => {
      console.log(JSON.stringify({
        id: job.id, name: job.name, data: job.data, attemptsMade: job.attemptsMade,
      }));
      return 'ok';
    },
    { connection: connection(url), prefix },
  );
  worker.on('completed', () => {
    completed += 1;
    if (completed >= wanted) done();
  });
  worker.on('error', (error) => { console.error(String(error)); process.exit(3); });
  await finished;
  await worker.close();
  const queue = new Queue(queueName, { connection: connection(url), prefix });
  console.log(JSON.stringify({ counts: await queue.getJobCounts('waiting', 'active', 'completed', 'failed') }));
  await queue.close();
}

const [command, ...args] = process.argv.slice(2);
const run = { add, work }[command];
if (!run) {
  console.error(`unknown command ${command}: add or work`);
  process.exit(2);
}
run(args).then(() => process.exit(0), (error) => { console.error(String(error)); process.exit(1); });
