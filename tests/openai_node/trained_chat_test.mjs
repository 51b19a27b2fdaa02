// Chat with the trained model (deploy/models/kjv-moe, its own chat template)
// through the official OpenAI Node client, streamed and not; prints one JSON
// line that tests/openai/trained_chat_test.cc checks.
//   BASE_URL=http://127.0.0.1:PORT/v1 MODEL=kjv-moe node trained_chat_test.mjs
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'unused', maxRetries: 0 });
const model = process.env.MODEL;
const messages = [
  { role: 'user', content: 'Who made the heaven and the earth?' },
];

const out = { text: '', finish: null, usage: null, chunks: 0, role: null };
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 16, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  out.chunks += 1;
  if (chunk.choices.length > 0) {
    const c = chunk.choices[0];
    out.role ??= c.delta.role ?? null;
    out.text += c.delta.content ?? '';
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  if (chunk.usage) out.usage = chunk.usage;
}
const whole = await client.chat.completions.create({ model, messages, max_tokens: 16 });
out.nonstream_text = whole.choices[0].message.content;
out.nonstream_finish = whole.choices[0].finish_reason;
out.nonstream_usage = whole.usage;
// Sampled, seeded: the same twice.
const sampled = [];
for (let i = 0; i < 2; i += 1) {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0.8, top_p: 0.95, seed: 7,
  });
  sampled.push(r.choices[0].message.content);
}
out.sampled = sampled;
console.log(JSON.stringify(out));
