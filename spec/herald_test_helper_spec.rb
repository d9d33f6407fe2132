# frozen_string_literal: true

require "spec_helper"

TEXT = {"text" => "日本語 🎉 héllo", "nul" => "a\u0000b", "empty" => ""}.freeze

RSpec.describe Herald::TestHelper do
  # Whichever of these runs second proves the first one's message is gone.
  2.times do |i|
    it "starts example #{i} on an empty memory store" do
      expect(Herald.bus.store).to be_a(Herald::Store::Memory)
      expect(Herald.bus.store.last_global_id).to eq(0)
      Herald.publish("/left-over", {"i" => i})
    end
  end

  it "captures what a block publishes, oldest first" do
    Herald.publish("/before", 1)
    messages = capture_published do
      Herald.publish("/chat", TEXT, user_ids: [7])
      Herald.publish("/news", "second")
    end
    expect(messages.map { |m| [m.channel, m.data] }).to eq([["/chat", TEXT], ["/news", "second"]])
    expect(messages.first.user_ids).to eq([7])
  end

  it "assert_published passes on a match and fails as an RSpec expectation otherwise" do
    Herald.publish("/chat", TEXT)
    expect(assert_published("/chat", TEXT).map(&:data)).to eq([TEXT])
    assert_published("/other") { Herald.publish("/other", {"n" => 1}) }
    expect { assert_published("/chat", {"text" => "absent"}) }
      .to raise_error(RSpec::Expectations::ExpectationNotMetError, /日本語/)
    expect { assert_published("/nothing") { Herald.publish("/chat", 2) } }
      .to raise_error(RSpec::Expectations::ExpectationNotMetError, %r{Expected a message on /nothing})
  end

  it "refute_published passes when nothing matched and fails otherwise" do
    refute_published("/chat")
    refute_published("/chat") { Herald.publish("/other", 1) }
    Herald.publish("/chat", TEXT)
    expect { refute_published("/chat") }.to raise_error(RSpec::Expectations::ExpectationNotMetError, /🎉/)
  end

  describe "the herald_publish matcher" do
    it "matches a block that publishes on the channel (with the data, when given)" do
      expect { Herald.publish("/chat", TEXT) }.to herald_publish("/chat")
      expect { Herald.publish("/chat", TEXT) }.to herald_publish("/chat", TEXT)
      expect { Herald.publish("/chat", "other") }.not_to herald_publish("/chat", TEXT)
      expect { Herald.publish("/news", TEXT) }.not_to herald_publish("/chat")
    end

    it "says what was published when it fails" do
      expect { expect { Herald.publish("/news", TEXT) }.to herald_publish("/chat", "hi") }
        .to raise_error(RSpec::Expectations::ExpectationNotMetError, %r{expected the block to publish "hi" on /chat.*/news.*日本語}m)
      expect { expect { Herald.publish("/chat", TEXT) }.not_to herald_publish("/chat") }
        .to raise_error(RSpec::Expectations::ExpectationNotMetError, %r{expected the block not to publish on /chat.*héllo}m)
    end

    it "needs a block" do
      expect { expect(1).to herald_publish("/chat") }.to raise_error(Herald::InvalidArgumentError, /block/)
    end
  end

  describe "a nested group" do
    before { Herald.publish("/fixture", "from the outer before") }

    describe "one level deeper" do
      it "keeps what the outer before published (the store is reset once per example)" do
        assert_published("/fixture", "from the outer before")
        expect(Herald.bus.store.last_global_id).to eq(1)
      end
    end
  end
end

# A group that includes the module itself (no RSpec.configure line) gets the same fresh store.
RSpec.describe "a group including Herald::TestHelper directly" do
  include Herald::TestHelper

  it "starts empty" do
    expect(Herald.bus.store.last_global_id).to eq(0)
    expect { Herald.publish("/x", "ü") }.to herald_publish("/x", "ü")
  end
end

# Deferred subscribers run only when the example asks (perform_published_events), on its thread.
RSpec.describe "perform_published_events under RSpec" do
  handled = []
  let(:subscriber) do
    Class.new do
      include Herald::Subscriber

      subscriber_name "SpecMailer"
      deferred
      subscribe_to "/signups"
      define_method(:call) { |event, _msg| (event == "boom") ? raise(ArgumentError, "bad signup ü") : handled << event }
    end
  end

  before do
    handled.clear
    subscriber
  end

  after { Herald::Events.registry.unregister(subscriber) }

  it "runs the deferred subscriber on what the block published, once" do
    Herald.publish("/signups", {"email" => "josé@例え.jp 🎉"})
    expect(handled).to eq([])
    perform_published_events { Herald.publish("/signups", {"n" => 2}) }
    expect(handled).to eq([{"n" => 2}])
    perform_published_events
    expect(handled).to eq([{"n" => 2}, {"email" => "josé@例え.jp 🎉"}])
    perform_published_events
    expect(handled.size).to eq(2)
    expect(Herald::Events.runtime.running?).to be(false)
  end

  it "lets a handler's error fail the example" do
    Herald.publish("/signups", "boom")
    expect { perform_published_events }.to raise_error(ArgumentError, "bad signup ü")
  end
end
